// Vectorized exp over float rows; see Note [Portable vector exp] in exp_rows.h.
// Written with GCC/Clang vector extensions: one template body, instantiated at
// the native width of each instruction set path.
#include "kernels/cpu/exp_rows.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define BT_EXP_X86 1
#else
#define BT_EXP_X86 0
#endif

#define BT_INLINE inline __attribute__((always_inline))

namespace bt::kernels::cpu::detail {
namespace {

constexpr int kLanes = 16;  // sum lanes, the same on every path

template <int W>
struct Vec {
  typedef double d __attribute__((vector_size(8 * W)));
  typedef int64_t l __attribute__((vector_size(8 * W)));
  typedef float f __attribute__((vector_size(4 * W)));
};

/// x = exp(x), the exp of the note, on a double or a vector of doubles D
/// (L: the int64 type of the same width). In place: no vector crosses a call ABI.
template <class D, class L>
BT_INLINE void exp_core(D& x) {
  constexpr double kShift = 0x1.8p52;  // adding it rounds to an integer, kept in the low bits
  x = x < -708.0 ? -708.0 : x;         // NaN stays NaN
  x = x > 708.0 ? 708.0 : x;
  const D t = x * 1.4426950408889634 + kShift;  // 1 / ln 2
  const D k = t - kShift;
  const D r = x - k * 0.6931471805599453;  // ln 2; |r| <= ln2 / 2
  D p = r * (1.0 / 362880) + 1.0 / 40320;
  p = p * r + 1.0 / 5040;
  p = p * r + 1.0 / 720;
  p = p * r + 1.0 / 120;
  p = p * r + 1.0 / 24;
  p = p * r + 1.0 / 6;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  L bits;
  std::memcpy(&bits, &t, sizeof bits);
  int64_t shift_bits;
  std::memcpy(&shift_bits, &kShift, 8);
  bits = (bits - shift_bits + 1023) << 52;  // 2^k
  D scale;
  std::memcpy(&scale, &bits, sizeof scale);
  x = p * scale;
}

BT_INLINE double exp_scalar(double x) {
  exp_core<double, int64_t>(x);
  return x;
}

/// The fixed combine tree of the 16 lane sums.
double combine(const double* a) {
  double s[8];
  for (int i = 0; i < 8; ++i) s[i] = a[i] + a[i + 8];
  for (int i = 0; i < 4; ++i) s[i] = s[i] + s[i + 4];
  return (s[0] + s[2]) + (s[1] + s[3]);
}

template <int W>
BT_INLINE float max_body(const float* x, int64_t n) {
  using F = typename Vec<W>::f;
  constexpr int NV = kLanes / W;
  F m[NV];
  for (int v = 0; v < NV; ++v) m[v] = F{} - std::numeric_limits<float>::infinity();
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int v = 0; v < NV; ++v) {
      F f;
      std::memcpy(&f, x + j + v * W, sizeof f);
      m[v] = m[v] < f ? f : m[v];
    }
  float best = -std::numeric_limits<float>::infinity();
  for (int v = 0; v < NV; ++v)
    for (int l = 0; l < W; ++l) best = std::max(best, m[v][l]);
  for (; j < n; ++j) best = std::max(best, x[j]);
  return best;
}

template <int W>
BT_INLINE double sum_exp_body(const float* x, int64_t n, double shift) {
  using D = typename Vec<W>::d;
  using L = typename Vec<W>::l;
  using F = typename Vec<W>::f;
  constexpr int NV = kLanes / W;
  D acc[NV] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int v = 0; v < NV; ++v) {
      F f;
      std::memcpy(&f, x + j + v * W, sizeof f);
      D e = __builtin_convertvector(f, D) - shift;
      exp_core<D, L>(e);
      acc[v] += e;
    }
  double lanes[kLanes];
  std::memcpy(lanes, acc, sizeof lanes);
  for (int l = 0; j + l < n; ++l) lanes[l] += exp_scalar(static_cast<double>(x[j + l]) - shift);
  return combine(lanes);
}

template <int W>
BT_INLINE void exp_scale_body(const float* x, int64_t n, double shift, double scale, float* out) {
  using D = typename Vec<W>::d;
  using L = typename Vec<W>::l;
  using F = typename Vec<W>::f;
  int64_t j = 0;
  for (; j + W <= n; j += W) {
    F f;
    std::memcpy(&f, x + j, sizeof f);
    D e = __builtin_convertvector(f, D) - shift;
    exp_core<D, L>(e);
    const F o = __builtin_convertvector(e * scale, F);
    std::memcpy(out + j, &o, sizeof o);
  }
  for (; j < n; ++j) out[j] = static_cast<float>(exp_scalar(static_cast<double>(x[j]) - shift) * scale);
}

struct Table {
  float (*max)(const float*, int64_t);
  double (*sum_exp)(const float*, int64_t, double);
  void (*exp_scale)(const float*, int64_t, double, double, float*);
};

// Generic: 16-byte vectors (SSE2 on x86-64, NEON on aarch64, scalar elsewhere).
float max_generic(const float* x, int64_t n) { return max_body<4>(x, n); }
double sum_exp_generic(const float* x, int64_t n, double s) { return sum_exp_body<2>(x, n, s); }
void exp_scale_generic(const float* x, int64_t n, double s, double c, float* o) {
  exp_scale_body<2>(x, n, s, c, o);
}
constexpr Table kGeneric{max_generic, sum_exp_generic, exp_scale_generic};

#if BT_EXP_X86
__attribute__((target("avx2"))) float max_avx2(const float* x, int64_t n) { return max_body<8>(x, n); }
__attribute__((target("avx2"))) double sum_exp_avx2(const float* x, int64_t n, double s) {
  return sum_exp_body<4>(x, n, s);
}
__attribute__((target("avx2"))) void exp_scale_avx2(const float* x, int64_t n, double s, double c, float* o) {
  exp_scale_body<4>(x, n, s, c, o);
}
constexpr Table kAvx2{max_avx2, sum_exp_avx2, exp_scale_avx2};

__attribute__((target("avx512f"))) float max_avx512(const float* x, int64_t n) { return max_body<16>(x, n); }
__attribute__((target("avx512f"))) double sum_exp_avx512(const float* x, int64_t n, double s) {
  return sum_exp_body<8>(x, n, s);
}
__attribute__((target("avx512f"))) void exp_scale_avx512(const float* x, int64_t n, double s, double c,
                                                         float* o) {
  exp_scale_body<8>(x, n, s, c, o);
}
constexpr Table kAvx512{max_avx512, sum_exp_avx512, exp_scale_avx512};
#endif

bool supported(ExpIsa isa) {
#if BT_EXP_X86
  __builtin_cpu_init();
  if (isa == ExpIsa::Avx512) return __builtin_cpu_supports("avx512f");
  if (isa == ExpIsa::Avx2) return __builtin_cpu_supports("avx2");
#endif
  return isa == ExpIsa::Generic;
}

const Table* table_for(ExpIsa isa) {
#if BT_EXP_X86
  if (isa == ExpIsa::Avx512) return &kAvx512;
  if (isa == ExpIsa::Avx2) return &kAvx2;
#endif
  return &kGeneric;
}

std::atomic<const Table*> g_table{nullptr};

const Table& table() {
  const Table* t = g_table.load(std::memory_order_acquire);
  if (t == nullptr) {
    t = table_for(best_exp_isa());
    g_table.store(t, std::memory_order_release);
  }
  return *t;
}

}  // namespace

ExpIsa best_exp_isa() {
  for (ExpIsa isa : {ExpIsa::Avx512, ExpIsa::Avx2})
    if (supported(isa)) return isa;
  return ExpIsa::Generic;
}

bool set_exp_isa(ExpIsa isa) {
  if (!supported(isa)) return false;
  g_table.store(table_for(isa), std::memory_order_release);
  return true;
}

double exp_d(double x) { return exp_scalar(x); }

float row_max(const float* x, int64_t n) { return table().max(x, n); }

double row_sum_exp(const float* x, int64_t n, double shift) { return table().sum_exp(x, n, shift); }

void row_exp_scale(const float* x, int64_t n, double shift, double scale, float* out) {
  table().exp_scale(x, n, shift, scale, out);
}

}  // namespace bt::kernels::cpu::detail
