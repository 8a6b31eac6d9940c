// Fused LayerNorm over the last dimension of a contiguous [rows, cols] buffer,
// optionally with the residual add before it (Note [Residual into LayerNorm]).
// Three dtypes (LnTypes): the activations' (x, y, the residual, the sum, dy,
// dx, dres: F32, F64 on CPU, BF16), the affine parameters' (w, b) and their
// gradients' (dw, db). The parameters and their gradients have the
// activations' dtype, or F32 with BF16 activations (f32 masters used
// directly, Note [Gradients in a wider dtype] in runtime/autograd/engine.cpp).
// mean and rstd are always float ([rows]); accumulation is in float (double
// for F64).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/dtype.h"
#include "kernels/common/error.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>
#endif

namespace bt::kernels {

/// The dtypes of one LayerNorm call (see the top of this file). One DType
/// means all three are the same.
struct LnTypes {
  DType x, w, g;
  LnTypes(DType all) : x(all), w(all), g(all) {}  // NOLINT(google-explicit-constructor): all the same
  LnTypes(DType x_, DType w_, DType g_) : x(x_), w(w_), g(g_) {}
};

/// Throws bt::Error naming `kernel` unless w and g are each x, or F32 with BF16 x.
inline void check_ln_types(LnTypes t, const char* kernel) {
  auto ok = [&](DType d) { return d == t.x || (t.x == DType::BF16 && d == DType::F32); };
  BT_CHECK(ok(t.w) && ok(t.g), kernel, ": parameters in ", t.w, " and their gradients in ", t.g,
           " do not go with ", t.x, " activations (they must be ", t.x,
           t.x == DType::BF16 ? ", or f32)" : ")");
}

// Note [Residual into LayerNorm]
// A pre-LN transformer adds each sublayer's output to the residual stream and
// normalizes the sum at once: s = x + r, y = LN(s). add_layernorm_forward
// does both in one pass over the rows -- it reads x and r, writes s (the
// stream goes on, and the LayerNorm backward needs it) and y -- instead of an
// add that writes s and a LayerNorm that reads it back. s is rounded to the
// activations' dtype before the statistics are taken, and the LayerNorm part
// is the plain forward's code on those values with the same choice of path,
// so y has the bits layernorm_forward gives on s: a recompute of y from the
// saved s (Note [Selective recompute]) rebuilds it exactly. r may repeat over
// the rows (row i reads r's row i % r_rows: positions under a batch of token
// embeddings). In backward, s has two readers: the LayerNorm, and whatever
// read the stream on; layernorm_backward takes the latter's gradient as
// `dres` and adds it to dx in the same pass, in float before dx is rounded,
// so ds = dres + LN'(dy) costs no separate add of gradients. x's and r's
// gradients are ds (r's summed over its repeats by the caller).
//
// Note [A bias into the residual add]
// A sublayer that ends in a Linear with a bias (GPT-2's attention projection)
// can leave its bias to the add: s = x + (r + rb), rb a [cols] vector in the
// parameters' dtype, added to r in float, then x, and s rounded once (in f32
// the bits of a Linear that adds its bias and an add after it). rb's gradient is the column sum of ds, which
// the backward has in hand row by row: layernorm_backward's `dsum` is the sum over rows of dx as written
// (rounded to the activations' dtype, dres included), in the gradients' dtype, summed like db. That takes the
// bias gradient off the Linear's weight-gradient GEMM (cuBLASLt's BGRADB epilogue, a pass of its own over the
// same gradient).
namespace cpu {
void layernorm_forward(LnTypes t, const void* x, const void* w, const void* b, void* y, float* mean,
                       float* rstd, int64_t rows, int64_t cols, float eps);
/// s = x + r (+ rb), then y = LayerNorm(s) (Note [Residual into LayerNorm]);
/// r has r_rows rows, a divisor of rows; rb, when not null, is [cols] in the
/// parameters' dtype (Note [A bias into the residual add]).
void add_layernorm_forward(LnTypes t, const void* x, const void* r, int64_t r_rows, const void* w,
                           const void* b, void* s, void* y, float* mean, float* rstd, int64_t rows,
                           int64_t cols, float eps, const void* rb = nullptr);
/// Writes (does not accumulate) dx, dw and db; dx also gets dres (same shape
/// as dx) added when it is not null. w/dw/b/db may be null (no affine).
/// dsum, when not null ([cols], the gradients' dtype; dx must not be null),
/// gets the column sums of dx as written (Note [A bias into the residual add]).
void layernorm_backward(LnTypes t, const void* dy, const void* x, const void* w, const float* mean,
                        const float* rstd, void* dx, void* dw, void* db, int64_t rows, int64_t cols,
                        const void* dres = nullptr, void* dsum = nullptr);
}  // namespace cpu
#ifdef BT_CUDA
namespace cuda {
void layernorm_forward(LnTypes t, const void* x, const void* w, const void* b, void* y, float* mean,
                       float* rstd, int64_t rows, int64_t cols, float eps, cudaStream_t stream);
void add_layernorm_forward(LnTypes t, const void* x, const void* r, int64_t r_rows, const void* w,
                           const void* b, void* s, void* y, float* mean, float* rstd, int64_t rows,
                           int64_t cols, float eps, cudaStream_t stream, const void* rb = nullptr);
/// Floats of scratch that layernorm_backward needs (for the dw/db partial
/// sums, and dsum's when `dsum` is asked for).
size_t layernorm_backward_scratch_floats(int64_t rows, int64_t cols, bool dsum = false);
void layernorm_backward(LnTypes t, const void* dy, const void* x, const void* w, const float* mean,
                        const float* rstd, void* dx, void* dw, void* db, int64_t rows, int64_t cols,
                        float* scratch, cudaStream_t stream, const void* dres = nullptr,
                        void* dsum = nullptr);
}  // namespace cuda
#endif
}  // namespace bt::kernels
