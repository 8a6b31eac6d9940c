// The CUDA GEMM's epilogues (kernels/gemm.h): which cuBLASLt epilogue runs
// each, most fused first, and what runs where cuBLASLt does not fuse it --
// bias, GELU and the GELU gradient on C after the plain product, and the bias
// gradient summed by the reduction kernel (Note [Fused bias gradient], Note
// [GELU-gradient epilogue]).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm/gemm_internal.cuh"
#include "kernels/reduce.h"

namespace bt::kernels::cuda {
namespace {
using namespace detail;

/// For every element of C (per batch item, m x n with ldc):
///   v = scale_mode ? (beta == 0 ? 0 : beta * C) : C;  v += bias[j];
///   pre_gelu = v (if any);  C = gelu ? gelu(v) : v;
/// or with gelu_in (DGelu, one batch item): C = v * gelu'(gelu_in).
template <typename T>
__global__ void epilogue_kernel(T* c, int64_t ldc, int64_t stride_c, int64_t m, int64_t n, int64_t batch,
                                const T* __restrict__ bias, T* __restrict__ pre, bool gelu,
                                const T* __restrict__ gelu_in, int64_t ld_gelu_in, bool scale_mode,
                                float beta) {
  const int64_t total = batch * m * n;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t j = e % n;
    const int64_t rest = e / n;
    const int64_t i = rest % m;
    const int64_t b = rest / m;
    const int64_t off = b * stride_c + i * ldc + j;
    float v;
    if (scale_mode)
      v = beta == 0.0f ? 0.0f : beta * ldf(c + off);
    else
      v = ldf(c + off);
    if (bias) v += ldf(bias + j);
    if (pre) stf(pre + off, v);
    if (gelu_in) v = v * gelu_tanh_grad(ldf(gelu_in + i * ld_gelu_in + j));
    stf(c + off, gelu ? gelu_tanh(v) : v);
  }
}

template <typename T>
void launch_epilogue(const GemmArgs& a, bool scale_mode, cudaStream_t stream) {
  const bool bias = a.epilogue == Epilogue::Bias || a.epilogue == Epilogue::BiasGelu;
  const bool gelu = a.epilogue == Epilogue::Gelu || a.epilogue == Epilogue::BiasGelu;
  T* pre = gelu ? static_cast<T*>(a.pre_gelu) : nullptr;
  const T* gelu_in = is_dgelu(a.epilogue) ? static_cast<const T*>(a.gelu_in) : nullptr;
  const int64_t total = a.batch * a.m * a.n;
  constexpr int kThreads = 256;
  epilogue_kernel<T><<<grid_stride_blocks(total, kThreads), kThreads, 0, stream>>>(
      static_cast<T*>(a.c), a.ldc, a.stride_c, a.m, a.n, a.batch,
      bias ? static_cast<const T*>(a.bias) : nullptr, pre, gelu, gelu_in, a.ld_gelu_in, scale_mode, a.beta);
  BT_KERNEL_CHECK();
}

cudaDataType_t cuda_type(DType dt) { return dt == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

bool lt_reads_bias(uint32_t epi) {
  return epi == CUBLASLT_EPILOGUE_BIAS || epi == CUBLASLT_EPILOGUE_GELU_BIAS ||
         epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool lt_uses_aux(uint32_t epi) {
  return epi == CUBLASLT_EPILOGUE_GELU_AUX || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
         epi == CUBLASLT_EPILOGUE_DGELU || epi == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}

}  // namespace

namespace gemm_detail {

const void* lt_aux(const GemmArgs& a) { return is_dgelu(a.epilogue) ? a.gelu_in : a.pre_gelu; }
int64_t lt_aux_ld(const GemmArgs& a) { return is_dgelu(a.epilogue) ? a.ld_gelu_in : a.ldc; }

bool lt_writes_bias_grad(uint32_t epi) {
  return epi == CUBLASLT_EPILOGUE_BGRADB || epi == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}

int lt_epilogues(const GemmArgs& a, uint32_t out[3]) {
  // cuBLASLt's aux matrix: ld and batch stride multiples of 8, 16 bytes aligned (cublasLt.h).
  const void* aux = lt_aux(a);
  const bool aux_ok = aux == nullptr || (lt_aux_ld(a) % 8 == 0 && (a.batch <= 1 || a.stride_c % 8 == 0) &&
                                         reinterpret_cast<uintptr_t>(aux) % 16 == 0);
  int n = 0;
  switch (a.epilogue) {
    case Epilogue::None:
      if (a.bias_grad) out[n++] = CUBLASLT_EPILOGUE_BGRADB;  // cuBLASLt's B is our A
      break;
    case Epilogue::Bias:
      out[n++] = CUBLASLT_EPILOGUE_BIAS;
      break;
    case Epilogue::Gelu:
      if (aux_ok) out[n++] = aux ? CUBLASLT_EPILOGUE_GELU_AUX : CUBLASLT_EPILOGUE_GELU;
      break;
    case Epilogue::BiasGelu:
      if (aux_ok) out[n++] = aux ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS;
      break;
    case Epilogue::DGeluBgrad:
      if (aux_ok) out[n++] = CUBLASLT_EPILOGUE_DGELU_BGRAD;
      [[fallthrough]];  // else DGELU, the bias gradient summed after
    case Epilogue::DGelu:
      if (aux_ok) out[n++] = CUBLASLT_EPILOGUE_DGELU;
      break;
  }
  out[n++] = CUBLASLT_EPILOGUE_DEFAULT;
  return n;
}

void set_lt_epilogue(cublasLtMatmulDesc_t op, uint32_t epi, const GemmArgs& a, DType c_dtype) {
  set_desc(op, CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
  if (lt_reads_bias(epi))
    set_desc(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(cuda_type(a.dtype)));
  if (lt_writes_bias_grad(epi))
    set_desc(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
             static_cast<int32_t>(cuda_type(gemm_bias_grad_dtype(a, c_dtype, "cuda gemm"))));
  if (lt_uses_aux(epi)) {
    set_desc(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, lt_aux_ld(a));
    if (a.batch > 1) set_desc(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, a.stride_c);
  }
  point_lt_epilogue(op, epi, a);
}

void point_lt_epilogue(cublasLtMatmulDesc_t op, uint32_t epi, const GemmArgs& a) {
  if (lt_reads_bias(epi)) set_desc(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, a.bias);
  if (lt_writes_bias_grad(epi)) set_desc(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, a.bias_grad);
  if (lt_uses_aux(epi)) set_desc(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, lt_aux(a));
}

void apply_epilogue(const GemmArgs& a, DType c_dtype, bool scale_mode, cudaStream_t stream) {
  dispatch_float(c_dtype, "gemm",
                 [&](auto tag) { launch_epilogue<typename decltype(tag)::type>(a, scale_mode, stream); });
}

/// The reduction kernel sum() uses, its scratch in this stream's cuBLASLt
/// workspace (stream order keeps the two apart).
void bias_grad_sum(const GemmArgs& a, DType c_dtype, cudaStream_t stream) {
  const BiasGradDims d = bias_grad_dims(a, "cuda gemm");
  const DType out_dt = gemm_bias_grad_dtype(a, c_dtype, "cuda gemm");
  const int64_t len = d.outer * d.inner;
  if (len == 0) return;
  if (d.dim == 0) {
    BT_CUDA_CHECK(cudaMemsetAsync(a.bias_grad, 0, static_cast<size_t>(len) * dtype_size(out_dt), stream));
    return;
  }
  const size_t floats = reduce_dim_scratch_floats(ReduceOp::Sum, d.outer, d.dim, d.inner);
  BT_CHECK(floats * sizeof(float) <= kWorkspaceBytes, "cuda gemm: the bias gradient's ", floats,
           " floats of scratch exceed the workspace");
  float* scratch = floats ? static_cast<float*>(workspace(stream)) : nullptr;
  reduce_dim(ReduceOp::Sum, a.dtype, out_dt, d.in, a.bias_grad, d.outer, d.dim, d.inner, scratch, stream);
}

}  // namespace gemm_detail
}  // namespace bt::kernels::cuda
