// CUDA fused softmax cross-entropy: one block per row.
// Forward: per-thread online (max, sum of exp) over the first `vocab` columns,
// combined across the block; writes lse and loss. Backward writes every one of
// the `ld` columns (0 beyond vocab). 16-byte loads when ld and the base allow.
//
// Note [A bf16 row in shared memory]
// The LM head's logits are a step's largest tensor (16K rows of 50304 bf16 at
// GPT-2 and Llama-150M scale, 1.6 GB), and the forward that also writes the
// gradient over them is one read and one write of it. The general kernel
// reads each row twice (the statistics, then the gradient) and updates its
// running (max, sum) with accurate expf and a branch a value; on an H200 it
// moved 2.1 TB/s. For a bf16 row that fits in shared memory (GPT-2's: 100 KB,
// two blocks an SM), the block copies it there once (16-byte cp.async, all
// in flight) and makes three passes over that copy: the max, the sum of
// exp2((x - max) log2 e) with the hardware's ex2.approx, and the gradient.
// Two blocks an SM overlap one row's exponentials with the other's copies.
// The gradient exp(x - lse) is ex2.approx in every bf16 kernel here (so the
// fused forward and forward-then-backward still give the same bits); its
// relative error, about 2^-22, is far below bf16's 2^-9. lse and the loss stay
// within a few f32 units in the last place. f32 rows keep the general kernels.
#include <climits>
#include <type_traits>

#include "kernels/cross_entropy.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/online_softmax.cuh"

namespace bt::kernels::cuda {
namespace {
using namespace detail;

constexpr int kThreads = 512;

constexpr float kLog2e = 1.4426950408889634f;

/// exp(x - lse): accurate expf for f32, ex2.approx for bf16 (Note [A bf16 row in shared memory]).
template <typename T>
__device__ __forceinline__ float exp_minus(float x, float lse) {
  if constexpr (std::is_same_v<T, float>)
    return expf(x - lse);
  else
    return fast_exp2(fmaf(x, kLog2e, -lse * kLog2e));
}

template <typename T>
__device__ __forceinline__ float ce_grad(float x, int64_t c, int64_t vocab, int32_t tg, float lse, float dl) {
  if (c >= vocab || tg == -1) return 0.0f;
  if (tg < 0 || tg >= vocab) return __int_as_float(0x7fc00000);
  return (exp_minus<T>(x, lse) - (c == tg ? 1.0f : 0.0f)) * dl;
}

/// The loss of a row from its lse: 0 for an ignored target (-1), NaN for one out of range.
template <typename T>
__device__ __forceinline__ float ce_loss(const T* p, int64_t vocab, int32_t tg, float lse) {
  if (tg == -1) return 0.0f;
  if (tg < 0 || tg >= vocab) return __int_as_float(0x7fc00000);
  return lse - to_float(p[tg]);
}

/// Writes row `p`'s gradient (softmax - onehot) * dl into `d` (all `ld` columns,
/// 0 beyond vocab). `p` and `d` may be the same row: each element is read,
/// then written, by one thread, so neither pointer is __restrict__.
template <typename T, bool kVec>
__device__ __forceinline__ void ce_grad_row(const T* p, T* d, int64_t vocab, int64_t ld, int32_t tg, float l,
                                            float dl) {
  if constexpr (kVec) {
    constexpr int V = kVec16<T>;
    using P = Pack<T, V>;
    const int64_t npacks = ld / V;  // ld % V == 0 on this path
    const P* pp = reinterpret_cast<const P*>(p);
    P* pd = reinterpret_cast<P*>(d);
    for (int64_t i = threadIdx.x; i < npacks; i += kThreads) {
      const int64_t c0 = i * V;
      P out;
      if (c0 < vocab) {
        const P pk = pp[i];  // the whole pack lies inside the row (c0 + V <= ld)
#pragma unroll
        for (int j = 0; j < V; ++j)
          out.v[j] = from_float<T>(ce_grad<T>(to_float(pk.v[j]), c0 + j, vocab, tg, l, dl));
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) out.v[j] = from_float<T>(0.0f);
      }
      pd[i] = out;
    }
  } else {
    for (int64_t c = threadIdx.x; c < ld; c += kThreads)
      stf(d + c, c < vocab ? ce_grad<T>(ldf(p + c), c, vocab, tg, l, dl) : 0.0f);
  }
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads)
    ce_bwd_kernel(const T* logits, int64_t vocab, int64_t ld, const int32_t* __restrict__ targets,
                  const float* __restrict__ lse, const float* __restrict__ dloss, T* dlogits) {
  // logits and dlogits may be the same buffer (the runtime writes the gradient
  // over logits nobody else holds).
  const int64_t row = blockIdx.x;
  ce_grad_row<T, kVec>(logits + row * ld, dlogits + row * ld, vocab, ld, targets[row], lse[row], dloss[row]);
}

/// d *= g / hint, unless g == hint (then nothing: the gradient the forward wrote
/// was for this g). Reads g on the device: no host sync, capture-safe.
template <typename T>
__global__ void ce_rescale_kernel(T* d, int64_t n, const float* __restrict__ g, float hint) {
  const float gv = *g;
  if (gv == hint) return;
  const float s = gv / hint;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    stf(d + i, ldf(d + i) * s);
}

/// One row per block: lse and loss; with kGrad also the gradient times `dl`
/// into `dlogits` (which may be the logits: Note [Gradient in the forward
/// pass] in runtime/ops/nn/cross_entropy.cpp), from the lse just computed, as
/// ce_bwd_kernel would write it.
template <typename T, bool kVec, bool kGrad>
__global__ void __launch_bounds__(kThreads)
    ce_fwd_kernel(const T* logits, int64_t vocab, int64_t ld, const int32_t* __restrict__ targets,
                  float* __restrict__ loss, float* __restrict__ lse_out, float dl, T* dlogits) {
  __shared__ float sm[32], ss[32], row_lse;
  const int64_t row = blockIdx.x;
  const T* p = logits + row * ld;
  MaxSum st{-INFINITY, 0.0f};
  int64_t scalar_begin = 0;
  if constexpr (kVec) {
    constexpr int V = kVec16<T>;
    using P = Pack<T, V>;
    const int64_t npacks = vocab / V;
    const P* pp = reinterpret_cast<const P*>(p);
    for (int64_t i = threadIdx.x; i < npacks; i += kThreads) {
      const P pk = pp[i];
#pragma unroll
      for (int j = 0; j < V; ++j) online_add(st, to_float(pk.v[j]));
    }
    scalar_begin = npacks * V;
  }
  for (int64_t j = scalar_begin + threadIdx.x; j < vocab; j += kThreads) online_add(st, ldf(p + j));
  st = warp_combine(st);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sm[warp] = st.m;
    ss[warp] = st.s;
  }
  __syncthreads();
  if (warp == 0) {
    MaxSum t = lane < kThreads / 32 ? MaxSum{sm[lane], ss[lane]} : MaxSum{-INFINITY, 0.0f};
    t = warp_combine(t);
    if (lane == 0) {
      const float lse = t.m + logf(t.s);
      row_lse = lse;
      if (lse_out) lse_out[row] = lse;
      if (loss) loss[row] = ce_loss(p, vocab, targets[row], lse);
    }
  }
  if constexpr (kGrad) {
    __syncthreads();
    ce_grad_row<T, kVec>(p, dlogits + row * ld, vocab, ld, targets[row], row_lse, dl);
  }
}

/// Note [A bf16 row in shared memory]: one row per block of kThreads, copied
/// into shared memory (16-byte cp.async) and read from there by every pass;
/// lse and loss, and with kGrad the gradient times `dl` into `dlogits` (may be
/// the logits). ld % 8 == 0 and the rows 16-byte aligned.
template <bool kGrad>
__global__ void __launch_bounds__(kThreads)
    ce_row_smem_kernel(const bf16_t* logits, int64_t vocab, int64_t ld, const int32_t* __restrict__ targets,
                       float* __restrict__ loss, float* __restrict__ lse_out, float dl, bf16_t* dlogits) {
  using P = Pack<bf16_t, 8>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  P* row_s = reinterpret_cast<P*>(smem_raw);
  __shared__ float red[33];
  const int64_t row = blockIdx.x;
  const int npacks = static_cast<int>(ld / 8), nvec = static_cast<int>(vocab / 8);
  const bf16_t* p = logits + row * ld;
  for (int i = threadIdx.x; i < npacks; i += kThreads) cp_async16(smem_u32(row_s + i), p + i * 8, true);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  // A pack straddling vocab (the last, when vocab % 8 != 0) is read lane by lane.
  auto each = [&](auto&& f) {
    for (int i = threadIdx.x; i < nvec; i += kThreads) {
      const P pk = row_s[i];
#pragma unroll
      for (int j = 0; j < 8; ++j) f(to_float(pk.v[j]));
    }
    if (threadIdx.x == 0)
      for (int64_t c = static_cast<int64_t>(nvec) * 8; c < vocab; ++c) f(to_float(row_s[c / 8].v[c % 8]));
  };
  float m = -INFINITY;
  each([&](float x) { m = fmaxf(m, x); });
  m = block_max(m, red);
  float s = 0.0f;
  if (m != -INFINITY) {
    const float ml = m * kLog2e;
    each([&](float x) { s += fast_exp2(fmaf(x, kLog2e, -ml)); });
  }
  s = block_sum(s, red);
  const float lse = m + logf(s);
  const int32_t tg = targets ? targets[row] : -1;
  if (threadIdx.x == 0) {
    if (lse_out) lse_out[row] = lse;
    // From the shared copy: the gradient may be overwriting the row in global memory already.
    if (loss) loss[row] = ce_loss(reinterpret_cast<const bf16_t*>(row_s), vocab, tg, lse);
  }
  if constexpr (kGrad) {
    P* d = reinterpret_cast<P*>(dlogits + row * ld);
    for (int i = threadIdx.x; i < npacks; i += kThreads) {
      const P pk = row_s[i];
      P out;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        out.v[j] = from_float<bf16_t>(
            ce_grad<bf16_t>(to_float(pk.v[j]), static_cast<int64_t>(i) * 8 + j, vocab, tg, lse, dl));
      d[i] = out;
    }
  }
}

/// Runs ce_row_smem_kernel when `T` is bf16, the rows allow 16-byte accesses
/// and one fits the device's shared memory; false (nothing launched) otherwise.
template <typename T, bool kGrad>
bool ce_rows_in_smem(const CrossEntropyArgs& a, float* loss, float* lse, float dl, void* dlogits,
                     cudaStream_t stream) {
  if constexpr (!std::is_same_v<T, bf16_t>) {
    return false;
  } else {
    const auto* pl = static_cast<const bf16_t*>(a.logits);
    auto* pd = static_cast<bf16_t*>(dlogits);
    if (a.ld % 8 != 0 || !aligned_to(pl, 16) || (kGrad && !aligned_to(pd, 16))) return false;
    const size_t smem = static_cast<size_t>(a.ld) * sizeof(bf16_t);
    if (smem + 33 * sizeof(float) > smem_optin_bytes()) return false;
    allow_smem(ce_row_smem_kernel<kGrad>, smem);
    ce_row_smem_kernel<kGrad><<<static_cast<unsigned>(a.rows), kThreads, smem, stream>>>(
        pl, a.vocab, a.ld, a.targets, loss, lse, dl, pd);
    BT_KERNEL_CHECK();
    return true;
  }
}

void check_args(const CrossEntropyArgs& a, const char* what) {
  BT_CHECK(a.rows >= 0 && a.vocab >= 0, "cuda ", what, ": negative size (rows ", a.rows, ", vocab ", a.vocab,
           ")");
  BT_CHECK(a.ld >= a.vocab, "cuda ", what, ": ld ", a.ld, " is smaller than vocab ", a.vocab);
  BT_CHECK(a.rows < INT_MAX, "cuda ", what, ": too many rows (", a.rows, ")");
}

}  // namespace

void cross_entropy_forward(const CrossEntropyArgs& a, float* loss, float* lse, cudaStream_t stream) {
  check_args(a, "cross_entropy_forward");
  dispatch_float(a.dt, "cross_entropy_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (a.rows == 0) return;
    BT_CHECK(a.vocab > 0, "cuda cross_entropy_forward: vocab must be positive");
    BT_CHECK(a.logits != nullptr, "cuda cross_entropy_forward: null logits");
    BT_CHECK(loss == nullptr || a.targets != nullptr, "cuda cross_entropy_forward: null targets");
    if (ce_rows_in_smem<T, false>(a, loss, lse, 0.0f, nullptr, stream)) return;
    const T* pl = static_cast<const T*>(a.logits);
    const bool vec = a.ld % kVec16<T> == 0 && aligned_to(pl, 16);
    const unsigned blocks = static_cast<unsigned>(a.rows);
    if (vec)
      ce_fwd_kernel<T, true, false>
          <<<blocks, kThreads, 0, stream>>>(pl, a.vocab, a.ld, a.targets, loss, lse, 0.0f, nullptr);
    else
      ce_fwd_kernel<T, false, false>
          <<<blocks, kThreads, 0, stream>>>(pl, a.vocab, a.ld, a.targets, loss, lse, 0.0f, nullptr);
    BT_KERNEL_CHECK();
  });
}

void cross_entropy_backward(const CrossEntropyArgs& a, const float* lse, const float* dloss, void* dlogits,
                            cudaStream_t stream) {
  check_args(a, "cross_entropy_backward");
  dispatch_float(a.dt, "cross_entropy_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (a.rows == 0 || a.ld == 0) return;
    BT_CHECK(a.logits != nullptr && a.targets != nullptr && lse != nullptr && dloss != nullptr &&
                 dlogits != nullptr,
             "cuda cross_entropy_backward: logits, targets, lse, dloss and dlogits must be non-null");
    const T* pl = static_cast<const T*>(a.logits);
    T* pd = static_cast<T*>(dlogits);
    const bool vec = a.ld % kVec16<T> == 0 && aligned_to(pl, 16) && aligned_to(pd, 16);
    const unsigned blocks = static_cast<unsigned>(a.rows);
    if (vec)
      ce_bwd_kernel<T, true><<<blocks, kThreads, 0, stream>>>(pl, a.vocab, a.ld, a.targets, lse, dloss, pd);
    else
      ce_bwd_kernel<T, false><<<blocks, kThreads, 0, stream>>>(pl, a.vocab, a.ld, a.targets, lse, dloss, pd);
    BT_KERNEL_CHECK();
  });
}

void cross_entropy_forward_backward(const CrossEntropyArgs& a, float* loss, float* lse, float dl,
                                    void* dlogits, cudaStream_t stream) {
  check_args(a, "cross_entropy_forward_backward");
  dispatch_float(a.dt, "cross_entropy_forward_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (a.rows == 0) return;
    BT_CHECK(a.vocab > 0, "cuda cross_entropy_forward_backward: vocab must be positive");
    BT_CHECK(a.logits != nullptr && a.targets != nullptr && dlogits != nullptr,
             "cuda cross_entropy_forward_backward: logits, targets and dlogits must be non-null");
    if (ce_rows_in_smem<T, true>(a, loss, lse, dl, dlogits, stream)) return;
    const T* pl = static_cast<const T*>(a.logits);
    T* pd = static_cast<T*>(dlogits);
    const bool vec = a.ld % kVec16<T> == 0 && aligned_to(pl, 16) && aligned_to(pd, 16);
    const unsigned blocks = static_cast<unsigned>(a.rows);
    if (vec)
      ce_fwd_kernel<T, true, true>
          <<<blocks, kThreads, 0, stream>>>(pl, a.vocab, a.ld, a.targets, loss, lse, dl, pd);
    else
      ce_fwd_kernel<T, false, true>
          <<<blocks, kThreads, 0, stream>>>(pl, a.vocab, a.ld, a.targets, loss, lse, dl, pd);
    BT_KERNEL_CHECK();
  });
}

void cross_entropy_rescale(DType dt, void* dlogits, int64_t n, const float* g, float hint,
                           cudaStream_t stream) {
  dispatch_float(dt, "cross_entropy_rescale", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (n == 0) return;
    const unsigned blocks = grid_stride_blocks(n, 256, 1);
    ce_rescale_kernel<T><<<blocks, 256, 0, stream>>>(static_cast<T*>(dlogits), n, g, hint);
    BT_KERNEL_CHECK();
  });
}

}  // namespace bt::kernels::cuda
