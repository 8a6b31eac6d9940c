// Rounding fp32 to TF32 and the 3xTF32 split of an operand (Note [3xTF32] in
// kernels/gemm.h), on the host. The CUDA split in kernels/cuda/gemm/gemm_x3.cu rounds
// with cvt.rna.tf32.f32, the same rounding: to nearest, ties away from zero.
// A TF32 value is an fp32 whose low 13 mantissa bits are zero; fp32 operands
// that are TF32 values go through a TF32 tensor core unchanged, whatever it
// does with the low bits of other inputs.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace bt::kernels {

/// x rounded to TF32 (10 stored mantissa bits), to nearest, ties away from
/// zero. Infinities stay; a NaN stays a NaN (quiet, its payload's top bits
/// kept); a finite value that rounds past the largest TF32 becomes inf.
inline float round_to_tf32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) {
    // inf has no low bits; a NaN's could all be low: keep it a NaN after the cut.
    if (u & 0x007fffffu) u |= 0x00400000u;
  } else {
    u += 0x1000u;  // half of the last kept bit, on the magnitude: ties go away from zero
  }
  u &= 0xffffe000u;
  std::memcpy(&x, &u, 4);
  return x;
}

/// The two TF32 parts of x: big = tf32(x), small = tf32(x - big) (x - big is
/// exact). small is 0 when big is not finite.
struct Tf32Split {
  float big, small;
};

inline Tf32Split split_tf32(float x) {
  const float big = round_to_tf32(x);
  return {big, std::isfinite(big) ? round_to_tf32(x - big) : 0.0f};
}

/// Note [3xTF32]: one GEMM over 3K computes the three products. Segment s of
/// K holds A's small part where kX3SmallA[s], else its big part; B likewise.
/// The small products come first.
inline constexpr bool kX3SmallA[3] = {true, false, false};
inline constexpr bool kX3SmallB[3] = {false, true, false};

}  // namespace bt::kernels
