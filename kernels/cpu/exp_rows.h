// Internal to the CPU kernels: vectorized exp over float rows, for the
// softmax-like loops (cross-entropy).
//
// Note [Portable vector exp]
// exp is computed in double from float inputs: x = k ln2 + r with
// k = round(x / ln2) and |r| <= ln2 / 2, then exp(r) by its degree-9 Taylor
// polynomial (Horner), times 2^k built in the exponent bits. The relative
// error is below 1e-11 (arguments are clamped to [-708, 708]); rounded to
// float the result is correctly rounded except within ~1e-4 ulp of a tie
// (exhaustively: at most 0.5001 ulp, vs 0.502 for glibc's expf). Only IEEE
// +, -, * and integer bit operations are used, in a fixed order, and the host
// build has -ffp-contract=off, so every instruction set path (generic,
// AVX2, AVX-512; chosen once from the CPU) and the scalar exp_d give the same
// bits. Row sums use 16 lane accumulators and a fixed combine tree, identical
// on every path, so results do not depend on the machine's vector width.
#pragma once

#include <cstdint>

namespace bt::kernels::cpu::detail {

/// exp(x) as described in Note [Portable vector exp] (scalar; same bits as the
/// lanes of the row functions).
double exp_d(double x);

/// Largest element of x[0, n), n >= 1; NaNs are skipped (as std::max(m, x) does).
float row_max(const float* x, int64_t n);

/// sum_j exp(double(x[j]) - shift) over j < n, in the order of the note.
double row_sum_exp(const float* x, int64_t n, double shift);

/// out[j] = float(exp(double(x[j]) - shift) * scale) for j < n.
void row_exp_scale(const float* x, int64_t n, double shift, double scale, float* out);

/// Instruction set paths of the row functions, for tests.
enum class ExpIsa { Generic, Avx2, Avx512 };
/// Forces a path; returns false (and changes nothing) when the CPU lacks it.
bool set_exp_isa(ExpIsa isa);
/// The best path this CPU supports (what the kernels use by default).
ExpIsa best_exp_isa();

}  // namespace bt::kernels::cpu::detail
