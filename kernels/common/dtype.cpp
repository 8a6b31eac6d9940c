#include "kernels/common/dtype.h"

#include <cmath>

namespace bt {

DType parse_dtype(std::string_view name) {
  for (DType t : kAllDTypes)
    if (dtype_name(t) == name) return t;
  if (name == "float32" || name == "fp32") return DType::F32;
  if (name == "bfloat16") return DType::BF16;
  if (name == "float16" || name == "fp16") return DType::F16;
  BT_FAIL("unknown dtype '", name, "'; use one of f32, f64, bf16, f16, i32, i64, u16, u8, bool");
}

uint16_t float_to_f16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (absx >= 0x477ff000u) {
    // Values that round to >= 65520 overflow to infinity.
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (absx < 0x38800000u) {
    // Subnormal half (or zero): value = m * 2^-24, round to nearest even.
    float a;
    std::memcpy(&a, &absx, 4);
    const float scaled = a * 16777216.0f;    // 2^24, exact
    const float r = std::nearbyint(scaled);  // default rounding mode: nearest even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  // Normal: rebias exponent 127 -> 15 and round the mantissa 23 -> 10 bits.
  uint32_t m = absx + 0xfffu + ((absx >> 13) & 1u);
  m -= (112u << 23);
  return static_cast<uint16_t>(sign | (m >> 13));
}

float f16_bits_to_float(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(man), -24);
    std::memcpy(&out, &v, 4);
    out |= sign;
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (man << 13);
  } else {
    out = sign | ((exp + 112u) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

}  // namespace bt
