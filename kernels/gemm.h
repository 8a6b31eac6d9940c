// The linear-algebra layer: row-major (batched) GEMM with optional bias and
// GELU epilogues, and the GELU-gradient epilogue of the MLP's backward.
// OpenBLAS on CPU, cuBLASLt on CUDA; strict F32 on sm_90 on the FP64 tensor
// cores (Note [Strict fp32 on the FP64 tensor cores]).
//
//   C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]   (then + bias, then GELU)
//
// op(X) is X or X^T (trans flags). All matrices are row-major with leading
// dimensions lda/ldb/ldc in elements. A, B, C and bias share `dtype`
// (F32, F64 on CPU only, BF16); accumulation is always in fp32 (fp64 for F64).
// An F32 GEMM multiplies as `math` says: strict fp32, TF32 tensor cores, or
// error-compensated TF32 (Note [3xTF32]).
// One mixed case: BF16 A and B with an F32 C (`c_dtype`), for f32 gradients
// of bf16 weights written, or accumulated with beta = 1, by the GEMM itself
// (Note [Gradients in a wider dtype], runtime/autograd/engine.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "kernels/common/dtype.h"
#include "kernels/common/gemm_math.h"
#include "kernels/common/widen.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>
#endif

namespace bt::kernels {

// Note [3xTF32]
// TF32 keeps fp32's 8 exponent bits but 10 of its 23 stored mantissa bits, so
// one TF32 product has a relative error up to 2^-11 per operand, 2^13 times
// fp32's unit roundoff u = 2^-24. Tf32x3 recovers fp32 accuracy on the tensor
// cores, as CUTLASS's 3xTF32 does: each operand x is split into
//   big = tf32(x),  small = tf32(x - big)      (tf32: round to nearest, ties
//                                                away, kernels/common/tf32.h)
// (x - big is exact in fp32), and C accumulates, in fp32,
//   A_small B_big + A_big B_small + A_big B_big
// (the small products first, while the sum is small). A product of two TF32
// values is exact in fp32 (11 x 11 significant bits), so what is lost on a
// term a b is the dropped A_small B_small, at most 2^-22 |a b|, and what each
// small part leaves out, x - big - small, at most 2^-22 |x|: at worst about
// 3 x 2^-22 = 12 u of |a b|, of random sign from term to term. Strict SGEMM
// pays the fp32 accumulation of the K terms too, up to K u of the sum of
// |a b| (about sqrt(K) u in practice), and that dominates: on normal data with
// K from 16 to 2048, 3xTF32's error against float64 was within 0.17 x 2^-22
// of SGEMM's, and one TF32 product's about 1000 times larger
// (GemmCpu.Tf32x3IsAsCloseToFloat64AsSgemm). On the H100 the tensor cores
// sum the products less exactly than SGEMM's FMAs: 3xTF32 came out 1.7-2.2x
// SGEMM's error there (CudaGemm.Tf32x3IsAsCloseToFloat64AsSgemm), still 600x
// below one TF32 product, and GPT-2 124M's per-step losses stayed within
// 4.4e-7 of PyTorch's strict fp32 over 20 steps. The cost is three times the
// tensor-core work, and on CUDA a pass that writes the split operands
// into scratch (kernels/cuda/gemm/gemm_x3.cu: why one GEMM over 3K). Non-finite
// inputs give non-finite results, but an inf may come out as NaN (inf * 0 in
// a small product), and a finite |x| within 2^-12 of FLT_MAX has an infinite
// big part.

// Note [Strict fp32 on the FP64 tensor cores]
// Strict fp32 (GemmMath::Strict) promises what SGEMM does: the fp32 operands
// as they are, no TF32 or bf16 rounding, results in fp32. On Hopper (sm_90)
// the FP64 tensor cores deliver that faster and more exactly than SGEMM. An
// H200 measured (bench/RESULTS.md, issue 18 step 21): mma.sync m16n8k16 f64
// at 66.5 TFLOP/s, the FFMA pipe at 65.0 -- the same peak -- but cuBLAS's
// DGEMM reaches 58-60 TFLOP/s on GPT-2's layer shapes (54 on the LM head's)
// where its SGEMM reaches 44-50: a DMMA does 2048 FMAs in one instruction, so
// the issue slots that SGEMM's FFMAs, loads and register-bank conflicts
// compete for are free.
//   The kernel (kernels/cuda/gemm/gemm_dmma.cu) reads fp32 tiles and widens
// them to fp64 in registers, exactly; a product of two fp32 values is exact
// in fp64 (24 + 24 < 53 significant bits), the K products are summed in
// fp64, and alpha, beta C and the bias are added in fp64 before C is rounded
// to fp32 once. So each element is the exact result rounded once, up to the
// fp64 sums' error (K 2^-53 of the sum of |terms|), where SGEMM carries up to
// K 2^-24 (CudaGemmDmma.IsCloserToFloat64ThanSgemm). The order of the sums is
// fixed by the tiling, so the results are bitwise repeatable; where K is not
// split (Note [Split K in fp64] in gemm_dmma.cu), a row's results do not
// depend on which other rows share the GEMM.
//   It runs where gemm_uses_dmma says: F32 under GemmMath::Strict with an F32
// C, 16-byte aligned A and B with leading dimensions and batch strides in
// whole 4-float chunks, on a compute capability 9.x device with the sm_90
// code built (the m16n8k16 f64 mma is sm_90's; other parts were not
// measured, and consumer ones have little FP64). Elsewhere strict fp32 stays
// cuBLAS's SGEMM, as it does with BT_GEMM_DMMA=0. The bias epilogue is fused;
// GELU epilogues and bias_grad run after the product (Note [Fused bias
// gradient]).

enum class Epilogue : uint8_t {
  None,
  Bias,        // C += bias[n] broadcast over rows (requires beta == 0)
  Gelu,        // C = gelu(C)
  BiasGelu,    // C = gelu(C + bias)
  DGelu,       // C = C * gelu'(gelu_in), the GELU's backward (requires beta == 0, one batch item)
  DGeluBgrad,  // DGelu, and bias_grad[j] = sum over i of the new C[i, j] (Note [Fused MLP backward])
};

struct GemmArgs {
  DType dtype = DType::F32;  // of A and B; also of C, bias and pre_gelu unless c_dtype is set
  /// C's dtype when it is wider than the operands': only F32 with BF16 A and
  /// B, only with Epilogue::None (no bias or GELU; alpha and beta as usual).
  std::optional<DType> c_dtype;
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batch items
  Epilogue epilogue = Epilogue::None;
  const void* bias = nullptr;  // [n], same dtype as C
  /// For Gelu/BiasGelu: if non-null, receives the pre-activation values
  /// (same shape/ld as C) for the backward pass.
  void* pre_gelu = nullptr;
  /// For DGelu/DGeluBgrad: the GELU's input (the pre-activation), m x n in
  /// C's dtype with leading dimension ld_gelu_in.
  const void* gelu_in = nullptr;
  int64_t ld_gelu_in = 0;
  /// F32 only: strict, TF32 or 3xTF32 products (Note [3xTF32]).
  GemmMath math = GemmMath::Strict;
  /// If non-null, with Epilogue::None: also the bias gradient of a
  /// weight-gradient GEMM (dW = dY^T X, op(A) = dY^T), bias_grad[i] = sum over
  /// k of op(A)[i, k] for i < m; only with an A without padding (lda = m when
  /// trans_a, else k). Note [Fused bias gradient]. With Epilogue::DGeluBgrad
  /// (which needs it): the sums of C's columns, bias_grad[j] for j < n; only
  /// with a C without padding (ldc = n). One batch item; in bias_grad_dtype.
  void* bias_grad = nullptr;
  /// bias_grad's dtype when it is wider than C's: only F32 for a BF16 C (the
  /// f32 gradient of a bf16 copy's bias, Note [Gradients in a wider dtype]).
  std::optional<DType> bias_grad_dtype;
};

// Note [Fused bias gradient]
// A linear layer's bias gradient is the column sum of dY, the A of its weight
// gradient's GEMM read transposed: asking that GEMM for it saves a pass over
// dY (9 of GPT-2's 16 activations of width C per block). On CUDA cuBLASLt's
// BGRADB epilogue sums it while the tiles stream through (our A is its B); when
// cuBLASLt refuses that epilogue for the problem, or under 3xTF32 (whose
// product runs on split copies), the sum is the reduction kernel the runtime's
// sum() uses, on the same stream. The CPU always uses that reduction
// (kernels/reduce.h), so its bits do not change with the fusion.

// Note [GELU-gradient epilogue]
// The MLP's backward (Note [Fused MLP backward], runtime/ops/nn/mlp.cpp) needs
// dPre = gelu'(pre) * (dY W2), the GEMM of the second layer's input gradient
// times the GELU's derivative at its input, and the first layer's bias
// gradient, the column sums of dPre. DGeluBgrad asks one GEMM for both (the
// MLP uses it in f64 only: in f32 and bf16 cuBLASLt's DGELU kernels are
// slower than a plain GEMM and one pass, Note [Fused MLP backward]). On
// CUDA cuBLASLt's DGELU_BGRAD epilogue reads pre as its aux matrix (ld_gelu_in
// a multiple of 8, 16-byte aligned) and writes the sums in bias_grad_dtype;
// its GELU is the tanh form of kernels/gelu.h, as for the forward's GELU
// epilogue. Where cuBLASLt refuses it, DGELU and the reduction kernel sum()
// uses (so always under 3xTF32, whose product may run in pieces); where it
// refuses both, the plain product, then an elementwise kernel (C *
// gelu'(gelu_in), the arithmetic of the gelu_backward kernel) and the
// reduction, on the same stream. The CPU multiplies in the product's float
// before its one rounding and sums the stored C with the reduction, so in f32
// it gives the bits of the unfused GEMM, gelu_backward and sum.

/// The dtype of C; throws bt::Error naming `who` for a c_dtype the GEMMs do
/// not support (the rules at GemmArgs::c_dtype).
inline DType gemm_c_dtype(const GemmArgs& g, const char* who) {
  if (!g.c_dtype || !widens(g.dtype, *g.c_dtype, who)) return g.dtype;
  BT_CHECK(g.epilogue == Epilogue::None, who, ": a bf16 GEMM into an f32 C takes no epilogue (got epilogue ",
           static_cast<int>(g.epilogue), "); add the bias or apply GELU separately");
  return *g.c_dtype;
}

inline bool is_dgelu(Epilogue e) { return e == Epilogue::DGelu || e == Epilogue::DGeluBgrad; }

/// Throws bt::Error naming `who` when a DGelu/DGeluBgrad GEMM breaks their
/// rules (GemmArgs::gelu_in); does nothing for the other epilogues.
inline void check_dgelu(const GemmArgs& g, const char* who) {
  if (!is_dgelu(g.epilogue)) return;
  BT_CHECK(g.beta == 0.0f && g.batch <= 1, who,
           ": the DGelu epilogues need beta == 0 and one batch item (got beta ", g.beta, ", batch ", g.batch,
           ")");
  BT_CHECK(g.gelu_in != nullptr || g.m == 0 || g.n == 0, who, ": the DGelu epilogues need gelu_in");
  BT_CHECK(g.ld_gelu_in >= (g.n > 1 ? g.n : 1), who, ": ld_gelu_in ", g.ld_gelu_in,
           " is smaller than n = ", g.n);
  BT_CHECK(g.epilogue == Epilogue::DGelu || g.bias_grad != nullptr, who,
           ": DGeluBgrad needs bias_grad (use DGelu for no bias gradient)");
}

/// The summed operand as the [outer, dim, inner] buffer the reductions take
/// (Note [Fused bias gradient]): op(A) over dim = k, or for DGeluBgrad C over
/// dim = m.
struct BiasGradDims {
  const void* in;
  int64_t outer, dim, inner;
};
/// bias_grad's dims and its dtype (GemmArgs::bias_grad_dtype); throws
/// bt::Error naming `who` when bias_grad is asked for where it is not supported.
inline BiasGradDims bias_grad_dims(const GemmArgs& g, const char* who) {
  const bool of_c = g.epilogue == Epilogue::DGeluBgrad;
  BT_CHECK((g.epilogue == Epilogue::None || of_c) && g.batch <= 1, who,
           ": bias_grad needs Epilogue::None or DGeluBgrad, and one batch item (got epilogue ",
           static_cast<int>(g.epilogue), ", batch ", g.batch, ")");
  if (of_c) {
    BT_CHECK(g.ldc == g.n || g.m == 0, who, ": DGeluBgrad needs a C without padding (ldc ", g.ldc,
             ", expected ", g.n, ")");
    return {g.c, 1, g.m, g.n};
  }
  BT_CHECK(g.lda == (g.trans_a ? g.m : g.k) || g.k == 0, who, ": bias_grad needs an A without padding (lda ",
           g.lda, ", expected ", g.trans_a ? g.m : g.k, ")");
  return g.trans_a ? BiasGradDims{g.a, 1, g.k, g.m} : BiasGradDims{g.a, g.m, g.k, 1};
}
/// The dtype of bias_grad, given C's (`c_dtype`, from gemm_c_dtype).
inline DType gemm_bias_grad_dtype(const GemmArgs& g, DType c_dtype, const char* who) {
  if (!g.bias_grad_dtype) return c_dtype;
  widens(c_dtype, *g.bias_grad_dtype, who);
  return *g.bias_grad_dtype;
}

namespace cpu {
void gemm(const GemmArgs& args);
}  // namespace cpu
#ifdef BT_CUDA
namespace cuda {
/// Floats of device scratch that gemm(args) needs: 0 unless an F32 GEMM runs
/// Tf32x3 (the split operands; at most 512 MiB, the GEMM runs in pieces when
/// more would be needed) or splits K on the FP64 tensor cores (fp64 partial
/// products, at most 64 MiB; without the scratch it does not split).
size_t gemm_scratch_floats(const GemmArgs& args);
/// The size of each piece a Tf32x3 GEMM runs in, in batch items, rows and
/// columns of C, and K (Note [Two copies or three] in kernels/cuda/gemm/gemm_x3.cu), with
/// `scratch_floats` of scratch when that is less than gemm_scratch_floats(args)
/// (else with what it asks for). Host code: no GPU needed.
struct GemmPieces {
  int64_t batch, m, n, k;
};
GemmPieces gemm_x3_pieces(const GemmArgs& args, size_t scratch_floats);
/// `scratch`: gemm_scratch_floats(args) floats, used in stream order (null
/// when that is 0), or scratch_floats when that is less (the GEMM then runs in
/// more pieces, gemm_x3_pieces; the tests use it to cut small GEMMs).
void gemm(const GemmArgs& args, cudaStream_t stream, float* scratch = nullptr, size_t scratch_floats = 0);
/// The cuBLASLt epilogue (cublasLtEpilogue_t) of this thread's last cuBLASLt
/// product, for tests and benchmarks to report what cuBLASLt fused:
/// CUBLASLT_EPILOGUE_DEFAULT when the epilogue ran as kernels after it.
uint32_t last_lt_epilogue();
/// Note [Strict fp32 on the FP64 tensor cores]: whether this device runs
/// them (compute capability 9.x, with the sm_90 code built), whether they
/// are on (BT_GEMM_DMMA=0 at start turns them off; set_gemm_dmma changes it,
/// for tests and benchmarks), and whether gemm(args) takes them.
bool gemm_dmma_available();
bool gemm_dmma_enabled();
void set_gemm_dmma(bool on);
bool gemm_uses_dmma(const GemmArgs& args);
/// Plain cuBLAS (cublasGemmEx / cublasSgemm), used only as the benchmark ceiling.
void cublas_reference_gemm(const GemmArgs& args, cudaStream_t stream);
}  // namespace cuda
#endif
}  // namespace bt::kernels
