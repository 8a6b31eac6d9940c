// Philox-4x32-10 and portable transforms to uniform and normal floats.
//
// Note [Portable RNG]
// The CPU and CUDA random fills must give bitwise-identical tensors for the
// same (seed, offset), so a model initialized on either device is the same
// model. Integer Philox is exact everywhere; the float transforms are the
// problem, because libm's log/cos and CUDA's differ in the last ulp. So the
// normal transform (Box-Muller) is computed in double with our own log and cos
// built only from IEEE +, -, *, / (correctly rounded on both sides) in a fixed
// order. On the device the operations are spelled __dadd_rn/__dmul_rn/
// __ddiv_rn so nvcc cannot contract them into FMAs; the host build uses
// -ffp-contract=off for the same reason. The result is rounded to float once.
// Element i of a fill uses counter (offset + i) and key seed; nothing depends
// on the launch shape.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/common/layout.h"  // BT_HD

namespace bt::kernels::philox {

struct U32x4 {
  uint32_t v[4];
};

BT_HD inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

/// Philox-4x32 with 10 rounds. counter = (c0,c1,c2,c3), key = (k0,k1).
BT_HD inline U32x4 philox4x32_10(uint64_t counter, uint64_t seed) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(0xD2511F53u, c0, hi0, lo0);
    mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return U32x4{{c0, c1, c2, c3}};
}

#ifdef __CUDA_ARCH__
#define BT_DADD(a, b) __dadd_rn((a), (b))
#define BT_DSUB(a, b) __dsub_rn((a), (b))
#define BT_DMUL(a, b) __dmul_rn((a), (b))
#define BT_DDIV(a, b) __ddiv_rn((a), (b))
#define BT_DSQRT(a) __dsqrt_rn(a)
#else
#define BT_DADD(a, b) ((a) + (b))
#define BT_DSUB(a, b) ((a) - (b))
#define BT_DMUL(a, b) ((a) * (b))
#define BT_DDIV(a, b) ((a) / (b))
#define BT_DSQRT(a) portable_host_sqrt(a)
#endif

#ifndef __CUDA_ARCH__
double portable_host_sqrt(double x);  // std::sqrt: IEEE correctly rounded
#endif

BT_HD inline uint64_t double_bits(double x) {
#ifdef __CUDA_ARCH__
  return static_cast<uint64_t>(__double_as_longlong(x));
#else
  uint64_t u;
  std::memcpy(&u, &x, 8);
  return u;
#endif
}
BT_HD inline double bits_double(uint64_t u) {
#ifdef __CUDA_ARCH__
  return __longlong_as_double(static_cast<long long>(u));
#else
  double x;
  std::memcpy(&x, &u, 8);
  return x;
#endif
}

/// Natural log for x in (0, 1], from exact bit manipulation and IEEE ops only.
BT_HD inline double portable_log(double x) {
  uint64_t u = double_bits(x);
  int e = static_cast<int>((u >> 52) & 0x7ff) - 1022;  // x = m * 2^e, m in [0.5, 1)
  double m = bits_double((u & 0x000fffffffffffffull) | 0x3fe0000000000000ull);
  if (m < 0.70710678118654752440) {  // keep m in [sqrt(1/2), sqrt(2))
    m = BT_DMUL(m, 2.0);
    e -= 1;
  }
  const double f = BT_DSUB(m, 1.0);
  const double s = BT_DDIV(f, BT_DADD(2.0, f));  // log(m) = 2 atanh(s)
  const double s2 = BT_DMUL(s, s);
  double sum = 0.0;
  for (int k = 23; k >= 1; k -= 2) sum = BT_DADD(BT_DDIV(1.0, static_cast<double>(k)), BT_DMUL(s2, sum));
  const double ln2 = 0.69314718055994530942;
  return BT_DADD(BT_DMUL(static_cast<double>(e), ln2), BT_DMUL(BT_DMUL(2.0, s), sum));
}

/// cos(2 pi t) for t in [0, 1), from IEEE ops only.
BT_HD inline double portable_cos_2pi(double t) {
  double r = t >= 0.5 ? BT_DSUB(1.0, t) : t;  // cos is symmetric about t = 0.5
  double sign = 1.0;
  if (r > 0.25) {  // cos(2 pi r) = -cos(2 pi (0.5 - r))
    r = BT_DSUB(0.5, r);
    sign = -1.0;
  }
  const double x = BT_DMUL(6.28318530717958647692, r);  // x in [0, pi/2]
  const double x2 = BT_DMUL(x, x);
  // Horner form of sum_{k=0..13} (-1)^k x^(2k) / (2k)!
  double sum = 0.0;
  for (int k = 13; k >= 1; --k) {
    const double c = BT_DDIV(1.0, static_cast<double>((2 * k) * (2 * k - 1)));
    sum = BT_DMUL(BT_DMUL(x2, c), BT_DSUB(1.0, sum));
  }
  return BT_DMUL(sign, BT_DSUB(1.0, sum));
}

/// Uniform float in [0, 1) from the top 24 bits of a 32-bit draw.
BT_HD inline float uniform01(uint32_t u) { return static_cast<float>(u >> 8) * (1.0f / 16777216.0f); }

/// Element i of a uniform fill in [lo, hi).
BT_HD inline float uniform_at(uint64_t seed, uint64_t index, float lo, float hi) {
  const U32x4 r = philox4x32_10(index, seed);
  const double u = static_cast<double>(uniform01(r.v[0]));
  return static_cast<float>(BT_DADD(static_cast<double>(lo),
                                    BT_DMUL(u, BT_DSUB(static_cast<double>(hi), static_cast<double>(lo)))));
}

/// Element i of a normal fill (Box-Muller, cosine branch), rounded once to float.
BT_HD inline float normal_at(uint64_t seed, uint64_t index, float mean, float std) {
  const U32x4 r = philox4x32_10(index, seed);
  const double u1 = BT_DMUL(static_cast<double>((r.v[0] >> 8) + 1u), 1.0 / 16777216.0);  // (0, 1]
  const double u2 = BT_DMUL(static_cast<double>(r.v[1] >> 8), 1.0 / 16777216.0);         // [0, 1)
  const double radius = BT_DSQRT(BT_DMUL(-2.0, portable_log(u1)));
  const double z = BT_DMUL(radius, portable_cos_2pi(u2));
  return static_cast<float>(BT_DADD(static_cast<double>(mean), BT_DMUL(static_cast<double>(std), z)));
}

}  // namespace bt::kernels::philox
