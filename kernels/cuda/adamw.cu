// CUDA fused AdamW: grid-stride over 4-element packs (float4 for p/m/v, 16- or
// 8-byte packs for the gradient and the optional low-precision param copy),
// scalar fallback when a pointer is not aligned, scalar tail in the same kernel.
#include <type_traits>

#include "kernels/adamw.h"
#include "kernels/cuda/common.cuh"

namespace bt::kernels::cuda {
namespace {
using namespace detail;

struct Hyper {
  float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, wd, bias1, bias2, grad_scale;
  const float* dyn;        // optional {lr, bias1, bias2} in device memory
  const float* dyn_scale;  // optional grad_scale in device memory
};

/// `h` with the values a CUDA graph replay supplies read from device memory.
__device__ __forceinline__ Hyper resolve(Hyper h) {
  if (h.dyn != nullptr) {
    h.lr = h.dyn[0];
    h.bias1 = h.dyn[1];
    h.bias2 = h.dyn[2];
  }
  if (h.dyn_scale != nullptr) h.grad_scale = *h.dyn_scale;
  return h;
}

__device__ __forceinline__ void adam_update(float& p, float& m, float& v, float g, const Hyper& h) {
  g = g * h.grad_scale;
  m = h.beta1 * m + h.one_minus_beta1 * g;
  v = h.beta2 * v + h.one_minus_beta2 * g * g;
  const float mhat = m / h.bias1;
  const float denom = sqrtf(v / h.bias2) + h.eps;
  p = p - h.lr * (mhat / denom + h.wd * p);
}

struct NoCopy {};

template <typename G, typename C, bool kVec>
__global__ void __launch_bounds__(256)
    adamw_kernel(float* __restrict__ p, const G* __restrict__ g, float* __restrict__ m, float* __restrict__ v,
                 C* __restrict__ copy, int64_t n, Hyper given) {
  const Hyper h = resolve(given);
  if (!isfinite(h.grad_scale)) return;  // a skipped step (kernels/adamw.h): nothing is written
  constexpr bool kCopy = !std::is_same_v<C, NoCopy>;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t scalar_begin = 0;
  if constexpr (kVec) {
    const int64_t n4 = n / 4;
    for (int64_t i = tid; i < n4; i += stride) {
      float4 pv = reinterpret_cast<const float4*>(p)[i];
      float4 mv = reinterpret_cast<const float4*>(m)[i];
      float4 vv = reinterpret_cast<const float4*>(v)[i];
      const Pack<G, 4> gp = reinterpret_cast<const Pack<G, 4>*>(g)[i];
      adam_update(pv.x, mv.x, vv.x, to_float(gp.v[0]), h);
      adam_update(pv.y, mv.y, vv.y, to_float(gp.v[1]), h);
      adam_update(pv.z, mv.z, vv.z, to_float(gp.v[2]), h);
      adam_update(pv.w, mv.w, vv.w, to_float(gp.v[3]), h);
      reinterpret_cast<float4*>(p)[i] = pv;
      reinterpret_cast<float4*>(m)[i] = mv;
      reinterpret_cast<float4*>(v)[i] = vv;
      if constexpr (kCopy) {
        Pack<C, 4> cp;
        cp.v[0] = from_float<C>(pv.x);
        cp.v[1] = from_float<C>(pv.y);
        cp.v[2] = from_float<C>(pv.z);
        cp.v[3] = from_float<C>(pv.w);
        reinterpret_cast<Pack<C, 4>*>(copy)[i] = cp;
      }
    }
    scalar_begin = n4 * 4;
  }
  for (int64_t i = scalar_begin + tid; i < n; i += stride) {
    float pv = p[i], mv = m[i], vv = v[i];
    adam_update(pv, mv, vv, to_float(g[i]), h);
    p[i] = pv;
    m[i] = mv;
    v[i] = vv;
    if constexpr (kCopy) copy[i] = from_float<C>(pv);
  }
}

template <typename G, typename C>
void launch_adamw(const AdamWArgs& a, C* copy, const Hyper& h, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const G* g = static_cast<const G*>(a.grad);
  bool vec =
      aligned_to(a.param, 16) && aligned_to(a.m, 16) && aligned_to(a.v, 16) && aligned_to(g, 4 * sizeof(G));
  if constexpr (!std::is_same_v<C, NoCopy>) vec = vec && aligned_to(copy, 4 * sizeof(C));
  const int64_t work = vec ? (a.n + 3) / 4 : a.n;
  const unsigned blocks = grid_stride_blocks(work, kThreads, 1);
  if (vec)
    adamw_kernel<G, C, true><<<blocks, kThreads, 0, stream>>>(a.param, g, a.m, a.v, copy, a.n, h);
  else
    adamw_kernel<G, C, false><<<blocks, kThreads, 0, stream>>>(a.param, g, a.m, a.v, copy, a.n, h);
  BT_KERNEL_CHECK();
}

template <typename G>
void dispatch_copy(const AdamWArgs& a, const Hyper& h, cudaStream_t stream) {
  if (a.param_copy == nullptr) {
    launch_adamw<G, NoCopy>(a, nullptr, h, stream);
    return;
  }
  switch (a.copy_dt) {
    case DType::F32:
      launch_adamw<G, float>(a, static_cast<float*>(a.param_copy), h, stream);
      return;
    case DType::BF16:
      launch_adamw<G, bf16_t>(a, static_cast<bf16_t*>(a.param_copy), h, stream);
      return;
    default:
      BT_FAIL("cuda adamw: param copy dtype ", a.copy_dt, " is not supported on CUDA (use f32 or bf16)");
  }
}

}  // namespace

void adamw(const AdamWArgs& a, cudaStream_t stream) {
  BT_CHECK(a.n >= 0, "cuda adamw: negative element count ", a.n);
  if (a.n == 0) return;
  BT_CHECK(a.param != nullptr && a.grad != nullptr && a.m != nullptr && a.v != nullptr,
           "cuda adamw: param, grad, m and v must all be non-null");
  const Hyper h{a.lr,           a.beta1, a.beta2, 1.0f - a.beta1, 1.0f - a.beta2, a.eps,
                a.weight_decay, a.bias1, a.bias2, a.grad_scale,   a.hyper,        a.scale};
  switch (a.grad_dt) {
    case DType::F32:
      dispatch_copy<float>(a, h, stream);
      return;
    case DType::BF16:
      dispatch_copy<bf16_t>(a, h, stream);
      return;
    default:
      BT_FAIL("cuda adamw: gradient dtype ", a.grad_dt, " is not supported on CUDA (use f32 or bf16)");
  }
}

}  // namespace bt::kernels::cuda
