// CUDA fused AdamW: grid-stride over 4-element packs (float4 for p/m/v, 16- or
// 8-byte packs for the gradient and the optional low-precision param copy),
// scalar fallback when a pointer is not aligned, scalar tail in the same kernel.
// adamw_many puts many buffers into one launch (Note [One AdamW launch]).
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

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

/// The update of one element. Every rounding is spelled out (no contraction
/// left to the compiler, which may fuse differently in each instantiation):
/// the kernels with and without a copy, one buffer or many, give the same bits.
__device__ __forceinline__ void adam_update(float& p, float& m, float& v, float g, const Hyper& h) {
  g = __fmul_rn(g, h.grad_scale);
  m = __fmaf_rn(h.beta1, m, __fmul_rn(h.one_minus_beta1, g));
  v = __fmaf_rn(h.beta2, v, __fmul_rn(__fmul_rn(h.one_minus_beta2, g), g));
  const float mhat = __fdiv_rn(m, h.bias1);
  const float denom = __fadd_rn(__fsqrt_rn(__fdiv_rn(v, h.bias2)), h.eps);
  p = __fmaf_rn(-h.lr, __fmaf_rn(h.wd, p, __fdiv_rn(mhat, denom)), p);
}

/// Elements 4 i .. 4 i + 3 (all pointers 4-element aligned); copy may be
/// null (no copy).
template <typename G, typename C>
__device__ __forceinline__ void update_pack(float* __restrict__ p, const G* __restrict__ g,
                                            float* __restrict__ m, float* __restrict__ v,
                                            C* __restrict__ copy, int64_t i, const Hyper& h) {
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
  if (copy == nullptr) return;
  Pack<C, 4> cp;
  cp.v[0] = from_float<C>(pv.x);
  cp.v[1] = from_float<C>(pv.y);
  cp.v[2] = from_float<C>(pv.z);
  cp.v[3] = from_float<C>(pv.w);
  reinterpret_cast<Pack<C, 4>*>(copy)[i] = cp;
}

/// Element i, as update_pack.
template <typename G, typename C>
__device__ __forceinline__ void update_one(float* __restrict__ p, const G* __restrict__ g,
                                           float* __restrict__ m, float* __restrict__ v, C* __restrict__ copy,
                                           int64_t i, const Hyper& h) {
  float pv = p[i], mv = m[i], vv = v[i];
  adam_update(pv, mv, vv, to_float(g[i]), h);
  p[i] = pv;
  m[i] = mv;
  v[i] = vv;
  if (copy != nullptr) copy[i] = from_float<C>(pv);
}

template <typename G, typename C, bool kVec>
__global__ void __launch_bounds__(256)
    adamw_kernel(float* __restrict__ p, const G* __restrict__ g, float* __restrict__ m, float* __restrict__ v,
                 C* __restrict__ copy, int64_t n, Hyper given) {
  const Hyper h = resolve(given);
  if (!isfinite(h.grad_scale)) return;  // a skipped step (kernels/adamw.h): nothing is written
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t scalar_begin = 0;
  if constexpr (kVec) {
    const int64_t n4 = n / 4;
    for (int64_t i = tid; i < n4; i += stride) update_pack(p, g, m, v, copy, i, h);
    scalar_begin = n4 * 4;
  }
  for (int64_t i = scalar_begin + tid; i < n; i += stride) update_one(p, g, m, v, copy, i, h);
}

template <typename G, typename C>
void launch_adamw(const AdamWArgs& a, C* copy, const Hyper& h, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const G* g = static_cast<const G*>(a.grad);
  const bool vec = aligned_to(a.param, 16) && aligned_to(a.m, 16) && aligned_to(a.v, 16) &&
                   aligned_to(g, 4 * sizeof(G)) && aligned_to(copy, 4 * sizeof(C));
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
  if (a.param_copy == nullptr) {  // no copy: the f32 kernel with a null one, as the many-buffer launch does
    launch_adamw<G, float>(a, nullptr, h, stream);
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

// Note [One AdamW launch]
// GPT-2 124M has 148 parameter tensors, most of them small (biases, LayerNorm
// affines): one launch each spent 1.54 ms of a 33.5 ms bf16 step on an H100,
// where the bytes moved take about 1.2 ms. adamw_many packs up to
// kPerLaunch buffers into one launch's arguments (a table passed by value, so
// a captured CUDA graph replays the pointers it was captured with, as the
// one-buffer kernel's arguments): each block updates one chunk of kChunk
// elements of one buffer, found from the table's first block of each
// buffer. The arithmetic per element is adam_update's: the same bits as
// adamw() on each buffer. Buffers whose pointers are not 4-element aligned
// go through adamw() one by one.
constexpr int kPerLaunch = 32;
constexpr int64_t kChunk = 16384;  // elements per block: 16 float4 packs per thread
constexpr int kManyThreads = 256;

struct Table {
  float* p[kPerLaunch];
  const void* g[kPerLaunch];
  float* m[kPerLaunch];
  float* v[kPerLaunch];
  void* copy[kPerLaunch];
  int64_t n[kPerLaunch];
  float wd[kPerLaunch];
  int first_block[kPerLaunch + 1];  // buffer i's blocks: [first_block[i], first_block[i + 1])
  int count;
};

template <typename G, typename C>
__global__ void __launch_bounds__(kManyThreads) adamw_many_kernel(const Table t, Hyper h) {
  h = resolve(h);
  if (!isfinite(h.grad_scale)) return;  // a skipped step: nothing is written
  int i = 0;
  while (i + 1 < t.count && t.first_block[i + 1] <= static_cast<int>(blockIdx.x)) ++i;
  h.wd = t.wd[i];
  float* p = t.p[i];
  const G* g = static_cast<const G*>(t.g[i]);
  float *m = t.m[i], *v = t.v[i];
  C* copy = static_cast<C*>(t.copy[i]);
  const int64_t begin = (static_cast<int64_t>(blockIdx.x) - t.first_block[i]) * kChunk;
  const int64_t end = t.n[i] < begin + kChunk ? t.n[i] : begin + kChunk, end4 = begin + (end - begin) / 4 * 4;
  for (int64_t j = begin / 4 + threadIdx.x; j < end4 / 4; j += kManyThreads)
    update_pack(p, g, m, v, copy, j, h);
  for (int64_t j = end4 + threadIdx.x; j < end; j += kManyThreads) update_one(p, g, m, v, copy, j, h);
}

bool packs_align(const AdamWArgs& a) {
  const size_t g4 = 4 * dtype_size(a.grad_dt), c4 = 4 * dtype_size(a.copy_dt);
  return aligned_to(a.param, 16) && aligned_to(a.m, 16) && aligned_to(a.v, 16) && aligned_to(a.grad, g4) &&
         (a.param_copy == nullptr || aligned_to(a.param_copy, c4));
}

Hyper hyper_of(const AdamWArgs& a) {
  return Hyper{a.lr,           a.beta1, a.beta2, 1.0f - a.beta1, 1.0f - a.beta2, a.eps,
               a.weight_decay, a.bias1, a.bias2, a.grad_scale,   a.hyper,        a.scale};
}

template <typename G, typename C>
void launch_many(const std::vector<const AdamWArgs*>& list, cudaStream_t stream) {
  for (size_t at = 0; at < list.size(); at += kPerLaunch) {
    Table t{};
    t.count = static_cast<int>(std::min<size_t>(kPerLaunch, list.size() - at));
    int64_t blocks = 0;
    for (int i = 0; i < t.count; ++i) {
      const AdamWArgs& a = *list[at + static_cast<size_t>(i)];
      t.p[i] = a.param, t.g[i] = a.grad, t.m[i] = a.m, t.v[i] = a.v, t.copy[i] = a.param_copy;
      t.n[i] = a.n, t.wd[i] = a.weight_decay;
      t.first_block[i] = static_cast<int>(blocks);
      blocks += ceil_div(a.n, kChunk);
      BT_CHECK(blocks < INT32_MAX, "cuda adamw_many: too many elements in one launch");
    }
    t.first_block[t.count] = static_cast<int>(blocks);
    adamw_many_kernel<G, C>
        <<<static_cast<unsigned>(blocks), kManyThreads, 0, stream>>>(t, hyper_of(*list[at]));
    BT_KERNEL_CHECK();
  }
}

}  // namespace

void adamw(const AdamWArgs& a, cudaStream_t stream) {
  BT_CHECK(a.n >= 0, "cuda adamw: negative element count ", a.n);
  if (a.n == 0) return;
  BT_CHECK(a.param != nullptr && a.grad != nullptr && a.m != nullptr && a.v != nullptr,
           "cuda adamw: param, grad, m and v must all be non-null");
  const Hyper h = hyper_of(a);
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

void adamw_many(std::span<const AdamWArgs> list, cudaStream_t stream) {
  // Launch groups: the gradient and copy dtypes fix the kernel; the
  // scalars every buffer of a launch shares must agree.
  std::vector<const AdamWArgs*> groups[4];  // {f32, bf16 gradient} x {f32, bf16 copy}
  for (const AdamWArgs& a : list) {
    if (a.n == 0) continue;
    BT_CHECK(a.grad_dt == DType::F32 || a.grad_dt == DType::BF16, "cuda adamw: gradient dtype ", a.grad_dt,
             " is not supported on CUDA (use f32 or bf16)");
    BT_CHECK(a.param_copy == nullptr || a.copy_dt == DType::F32 || a.copy_dt == DType::BF16,
             "cuda adamw: param copy dtype ", a.copy_dt, " is not supported on CUDA (use f32 or bf16)");
    const AdamWArgs& first = list[0];
    const bool shared = a.beta1 == first.beta1 && a.beta2 == first.beta2 && a.eps == first.eps &&
                        a.lr == first.lr && a.bias1 == first.bias1 && a.bias2 == first.bias2 &&
                        a.grad_scale == first.grad_scale && a.hyper == first.hyper && a.scale == first.scale;
    if (a.n < 0 || a.param == nullptr || a.grad == nullptr || a.m == nullptr || a.v == nullptr || !shared ||
        !packs_align(a)) {
      adamw(a, stream);  // its own checks and launch
      continue;
    }
    const bool bf16_copy = a.param_copy != nullptr && a.copy_dt == DType::BF16;
    groups[(a.grad_dt == DType::BF16 ? 2 : 0) + (bf16_copy ? 1 : 0)].push_back(&a);
  }
  launch_many<float, float>(groups[0], stream);
  launch_many<float, bf16_t>(groups[1], stream);
  launch_many<bf16_t, float>(groups[2], stream);
  launch_many<bf16_t, bf16_t>(groups[3], stream);
}

}  // namespace bt::kernels::cuda
