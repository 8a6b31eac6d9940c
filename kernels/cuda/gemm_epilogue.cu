// The CUDA GEMM's epilogues where cuBLASLt does not fuse them (kernels/gemm.h):
// bias and GELU on C after the plain product, and the bias gradient summed by
// the reduction kernel (Note [Fused bias gradient]).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm_internal.cuh"
#include "kernels/reduce.h"

namespace bt::kernels::cuda {
namespace {
using namespace detail;

/// For every element of C (per batch item, m x n with ldc):
///   v = scale_mode ? (beta == 0 ? 0 : beta * C) : C;  v += bias[j];
///   pre_gelu = v (if any);  C = gelu ? gelu(v) : v.
template <typename T>
__global__ void epilogue_kernel(T* c, int64_t ldc, int64_t stride_c, int64_t m, int64_t n, int64_t batch,
                                const T* __restrict__ bias, T* __restrict__ pre, bool gelu, bool scale_mode,
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
    stf(c + off, gelu ? gelu_tanh(v) : v);
  }
}

template <typename T>
void launch_epilogue(const GemmArgs& a, bool scale_mode, cudaStream_t stream) {
  const bool bias = a.epilogue == Epilogue::Bias || a.epilogue == Epilogue::BiasGelu;
  const bool gelu = a.epilogue == Epilogue::Gelu || a.epilogue == Epilogue::BiasGelu;
  T* pre = gelu ? static_cast<T*>(a.pre_gelu) : nullptr;
  const int64_t total = a.batch * a.m * a.n;
  constexpr int kThreads = 256;
  epilogue_kernel<T><<<grid_stride_blocks(total, kThreads), kThreads, 0, stream>>>(
      static_cast<T*>(a.c), a.ldc, a.stride_c, a.m, a.n, a.batch,
      bias ? static_cast<const T*>(a.bias) : nullptr, pre, gelu, scale_mode, a.beta);
  BT_KERNEL_CHECK();
}

}  // namespace

namespace gemm_detail {

void apply_epilogue(const GemmArgs& a, DType c_dtype, bool scale_mode, cudaStream_t stream) {
  dispatch_float(c_dtype, "gemm",
                 [&](auto tag) { launch_epilogue<typename decltype(tag)::type>(a, scale_mode, stream); });
}

/// Note [Fused bias gradient] without cuBLASLt: op(A) summed over k by the
/// reduction kernel sum() uses, its scratch in this stream's cuBLASLt
/// workspace (stream order keeps the two apart).
void bias_grad_sum(const GemmArgs& a, DType c_dtype, cudaStream_t stream) {
  if (a.k == 0) {
    BT_CUDA_CHECK(cudaMemsetAsync(a.bias_grad, 0, static_cast<size_t>(a.m) * dtype_size(c_dtype), stream));
    return;
  }
  const BiasGradDims d = bias_grad_dims(a, "cuda gemm");
  const size_t floats = reduce_dim_scratch_floats(ReduceOp::Sum, d.outer, d.dim, d.inner);
  BT_CHECK(floats * sizeof(float) <= kWorkspaceBytes, "cuda gemm: the bias gradient's ", floats,
           " floats of scratch exceed the workspace");
  float* scratch = floats ? static_cast<float*>(workspace(stream)) : nullptr;
  reduce_dim(ReduceOp::Sum, a.dtype, c_dtype, a.a, a.bias_grad, d.outer, d.dim, d.inner, scratch, stream);
}

}  // namespace gemm_detail
}  // namespace bt::kernels::cuda
