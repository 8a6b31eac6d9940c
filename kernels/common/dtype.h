// Element types and host-side conversions for the reduced-precision formats.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "kernels/common/error.h"

namespace bt {

/// Element type of a tensor. F64 exists for CPU reference math (gradient checks).
enum class DType : uint8_t { F32, F64, BF16, F16, I32, I64, U16, U8, Bool };

inline constexpr DType kAllDTypes[] = {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32,
                                       DType::I64, DType::U16, DType::U8,   DType::Bool};

inline constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64:
    case DType::I64:
      return 8;
    case DType::F32:
    case DType::I32:
      return 4;
    case DType::BF16:
    case DType::F16:
    case DType::U16:
      return 2;
    case DType::U8:
    case DType::Bool:
      return 1;
  }
  return 0;
}

inline constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::F64:
      return "f64";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "f16";
    case DType::I32:
      return "i32";
    case DType::I64:
      return "i64";
    case DType::U16:
      return "u16";
    case DType::U8:
      return "u8";
    case DType::Bool:
      return "bool";
  }
  return "?";
}

inline constexpr bool is_floating(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::BF16 || t == DType::F16;
}

/// Parses "f32", "bf16", ... ; throws bt::Error naming the bad value.
DType parse_dtype(std::string_view name);

inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

// ---- host conversions (round to nearest even; NaN stays NaN) ----

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_bits_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_f16_bits(float f);
float f16_bits_to_float(uint16_t h);

/// Storage type for bf16 on the host. Arithmetic goes through float.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) : bits(float_to_bf16_bits(f)) {}
  explicit operator float() const { return bf16_bits_to_float(bits); }
};

/// Storage type for IEEE half on the host.
struct f16 {
  uint16_t bits = 0;
  f16() = default;
  explicit f16(float f) : bits(float_to_f16_bits(f)) {}
  explicit operator float() const { return f16_bits_to_float(bits); }
};

}  // namespace bt
