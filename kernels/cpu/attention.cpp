// CPU causal attention, memory-efficient form (F32, F64, BF16).
//
// Forward, per query row i: a streaming (online) softmax over keys j <= i,
// rescaling the running output when the running max grows; writes
// o = sum_j p_j v_j and lse = max + log(sum_j exp(s_j - max)).
// Backward, per (b, key/value head hk): for each query head h of its group in
// order (Note [Grouped-query attention]; one head without GQA) recomputes
// P = exp(s - lse) row by row and accumulates dq (per query head), dk and dv
// (over the group) in compute-type buffers, which are then stored (every
// element of dq/dk/dv is written). For F64 the backward recomputes lse in
// double instead of using the float lse, so F64 gradients stay accurate to
// double precision.
//
// Heads run in parallel: query heads (b, h) in the forward, key/value heads
// (b, hk) with their groups in the backward. Within a head, the dot products q_i . k_j and
// do_i . v_j for all keys j of a query row are computed together from
// transposed K and V (vectorizable across j); each still sums over d in order
// from 0, so the results are bitwise those of the plain per-pair loops.
#include "kernels/attention.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/parallel.h"

namespace bt::kernels::cpu {
namespace {
using detail::acc_t;
using detail::load;
using detail::store;

/// Loads the [T, D] slice of head (b, h) into a packed compute-type buffer.
template <class T, class A>
void load_head(const T* base, const AttnStrides& s, int64_t b, int64_t h, int64_t T_, int64_t D,
               std::vector<A>& out) {
  out.resize(static_cast<size_t>(T_ * D));
  const T* p = base + b * s.b + h * s.h;
  for (int64_t t = 0; t < T_; ++t)
    for (int64_t d = 0; d < D; ++d) out[t * D + d] = load(p, t * s.t + d);
}

template <class T, class A>
void store_head(T* base, const AttnStrides& s, int64_t b, int64_t h, int64_t T_, int64_t D,
                const std::vector<A>& in) {
  T* p = base + b * s.b + h * s.h;
  for (int64_t t = 0; t < T_; ++t)
    for (int64_t d = 0; d < D; ++d) store(p, t * s.t + d, in[t * D + d]);
}

#define BT_INLINE inline __attribute__((always_inline))

template <class A>
BT_INLINE A dot(const A* x, const A* y, int64_t n) {
  A s = 0;
  for (int64_t d = 0; d < n; ++d) s += x[d] * y[d];
  return s;
}

/// Transposes the packed [T, D] buffer x into [D, T] (xt[d * T + t]).
template <class A>
void transpose(const std::vector<A>& x, int64_t T_, int64_t D, std::vector<A>& xt) {
  xt.resize(static_cast<size_t>(T_ * D));
  for (int64_t t = 0; t < T_; ++t)
    for (int64_t d = 0; d < D; ++d) xt[d * T_ + t] = x[t * D + d];
}

/// out[j] = dot(x, row j of y) for j < n, from yt = y transposed ([D, T_]).
/// Each out[j] sums d = 0, 1, ... from 0 exactly like dot(), so the bits are
/// the same; the j loop is independent and vectorizes.
template <class A>
BT_INLINE void dots(const A* x, const A* yt, int64_t T_, int64_t D, int64_t n, A* out) {
  for (int64_t j = 0; j < n; ++j) out[j] = 0;
  for (int64_t d = 0; d < D; ++d) {
    const A xd = x[d];
    const A* y = yt + d * T_;
    for (int64_t j = 0; j < n; ++j) out[j] += xd * y[j];
  }
}

/// y[d] += a * x[d] for d < n; y and x do not overlap (so it vectorizes).
template <class A>
BT_INLINE void axpy(A* __restrict y, A a, const A* __restrict x, int64_t n) {
  for (int64_t d = 0; d < n; ++d) y[d] += a * x[d];
}

/// One head of the forward on packed [T, D] buffers (kt: K transposed);
/// s is scratch of T_. Writes o and, when lse is set, lse[0, T_).
template <class A>
BT_INLINE void forward_head(const A* q, const A* kt, const A* v, int64_t T_, int64_t D, A scale, A* o, A* s,
                            float* lse) {
  for (int64_t i = 0; i < T_; ++i) {
    A* oi = o + i * D;
    A mx = -std::numeric_limits<A>::infinity(), sum = 0;
    for (int64_t d = 0; d < D; ++d) oi[d] = 0;
    dots(q + i * D, kt, T_, D, i + 1, s);  // s[j] = q_i . k_j
    for (int64_t j = 0; j <= i; ++j) {
      const A sj = scale * s[j];
      if (sj > mx) {  // rescale what was accumulated under the old max
        const A c = std::exp(mx - sj);
        sum *= c;
        for (int64_t d = 0; d < D; ++d) oi[d] *= c;
        mx = sj;
      }
      const A p = std::exp(sj - mx);
      sum += p;
      axpy(oi, p, v + j * D, D);
    }
    for (int64_t d = 0; d < D; ++d) oi[d] /= sum;
    if (lse) lse[i] = static_cast<float>(mx + std::log(sum));
  }
}

/// One head of the backward on packed buffers (kt, vt: K and V transposed;
/// lse: the head's row lse in A). Accumulates into dq, dk and dv (the caller
/// zeroes them: dk and dv once per group of query heads); s and dp are scratch of T_.
template <class A>
BT_INLINE void backward_head(const A* q, const A* k, const A* kt, const A* vt, const A* o, const A* dO,
                             const A* lse, int64_t T_, int64_t D, A scale, A* dq, A* dk, A* dv, A* s, A* dp) {
  for (int64_t i = 0; i < T_; ++i) {
    const A* qi = q + i * D;
    const A* doi = dO + i * D;
    A* dqi = dq + i * D;
    const A Di = dot(doi, o + i * D, D);
    dots(qi, kt, T_, D, i + 1, s);    // s[j] = q_i . k_j
    dots(doi, vt, T_, D, i + 1, dp);  // dp[j] = do_i . v_j
    for (int64_t j = 0; j <= i; ++j) {
      const A* kj = k + j * D;
      const A p = std::exp(scale * s[j] - lse[i]);
      const A ds = p * (dp[j] - Di);
      const A sds = scale * ds;
      axpy(dqi, sds, kj, D);
      axpy(dk + j * D, sds, qi, D);
      axpy(dv + j * D, p, doi, D);
    }
  }
}

// The float heads are compiled for several instruction sets and picked by
// the CPU at load time (GCC target_clones). Vectorizing never reorders a sum
// and the build has -ffp-contract=off, so every clone gives the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define BT_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define BT_CLONES
#endif

BT_CLONES void forward_head_f32(const float* q, const float* kt, const float* v, int64_t T_, int64_t D,
                                float scale, float* o, float* s, float* lse) {
  forward_head<float>(q, kt, v, T_, D, scale, o, s, lse);
}

BT_CLONES void backward_head_f32(const float* q, const float* k, const float* kt, const float* vt,
                                 const float* o, const float* dO, const float* lse, int64_t T_, int64_t D,
                                 float scale, float* dq, float* dk, float* dv, float* s, float* dp) {
  backward_head<float>(q, k, kt, vt, o, dO, lse, T_, D, scale, dq, dk, dv, s, dp);
}

template <class T>
void forward_impl(const AttnForward& a) {
  using A = acc_t<T>;
  const int64_t B = a.shape.B, H = a.shape.H, T_ = a.shape.T, D = a.shape.D, G = a.shape.group();
  const A scale = static_cast<A>(a.scale);
  // One (b, h) query head per index: heads write disjoint slices of o and lse.
  parallel_for(0, B * H, 1, [&](int64_t lo, int64_t hi) {
    std::vector<A> q, k, kt, v, o(static_cast<size_t>(T_ * D)), s(static_cast<size_t>(T_));
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      load_head(static_cast<const T*>(a.q), a.sq, b, h, T_, D, q);
      load_head(static_cast<const T*>(a.k), a.sk, b, h / G, T_, D, k);
      load_head(static_cast<const T*>(a.v), a.sv, b, h / G, T_, D, v);
      transpose(k, T_, D, kt);
      float* lse = a.lse ? a.lse + bh * T_ : nullptr;
      if constexpr (std::is_same_v<A, float>)
        forward_head_f32(q.data(), kt.data(), v.data(), T_, D, scale, o.data(), s.data(), lse);
      else
        forward_head<A>(q.data(), kt.data(), v.data(), T_, D, scale, o.data(), s.data(), lse);
      store_head(static_cast<T*>(a.o), a.so, b, h, T_, D, o);
    }
  });
}

template <class T>
void backward_impl(const AttnBackward& a) {
  using A = acc_t<T>;
  const int64_t B = a.shape.B, H = a.shape.H, T_ = a.shape.T, D = a.shape.D, G = a.shape.group();
  const int64_t Hkv = a.shape.kv_heads();
  const A scale = static_cast<A>(a.scale);
  const size_t TD = static_cast<size_t>(T_ * D);
  // One (b, hk) key/value head per index: it owns dk and dv of head hk and dq
  // of its G query heads, all disjoint slices; within it the order of every
  // sum is the serial one, query heads in order.
  parallel_for(0, B * Hkv, 1, [&](int64_t lo, int64_t hi) {
    std::vector<A> q, k, kt, v, vt, o, dO, dq(TD), dk(TD), dv(TD), lse(static_cast<size_t>(T_));
    std::vector<A> s(static_cast<size_t>(T_)), dp(static_cast<size_t>(T_));
    for (int64_t bhk = lo; bhk < hi; ++bhk) {
      const int64_t b = bhk / Hkv, hk = bhk % Hkv;
      load_head(static_cast<const T*>(a.k), a.sk, b, hk, T_, D, k);
      load_head(static_cast<const T*>(a.v), a.sv, b, hk, T_, D, v);
      transpose(k, T_, D, kt);
      transpose(v, T_, D, vt);
      std::fill(dk.begin(), dk.end(), A(0));
      std::fill(dv.begin(), dv.end(), A(0));
      for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {
        const int64_t bh = b * H + h;
        load_head(static_cast<const T*>(a.q), a.sq, b, h, T_, D, q);
        load_head(static_cast<const T*>(a.o), a.so, b, h, T_, D, o);
        load_head(static_cast<const T*>(a.dout), a.sdo, b, h, T_, D, dO);
        std::fill(dq.begin(), dq.end(), A(0));
        for (int64_t i = 0; i < T_; ++i) {
          if constexpr (std::is_same_v<A, double>) {  // recompute lse exactly
            dots(q.data() + i * D, kt.data(), T_, D, i + 1, s.data());
            A mx = -std::numeric_limits<A>::infinity(), sum = 0;
            for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, scale * s[j]);
            for (int64_t j = 0; j <= i; ++j) sum += std::exp(scale * s[j] - mx);
            lse[i] = mx + std::log(sum);
          } else {
            lse[i] = a.lse[bh * T_ + i];
          }
        }
        if constexpr (std::is_same_v<A, float>)
          backward_head_f32(q.data(), k.data(), kt.data(), vt.data(), o.data(), dO.data(), lse.data(), T_, D,
                            scale, dq.data(), dk.data(), dv.data(), s.data(), dp.data());
        else
          backward_head<A>(q.data(), k.data(), kt.data(), vt.data(), o.data(), dO.data(), lse.data(), T_, D,
                           scale, dq.data(), dk.data(), dv.data(), s.data(), dp.data());
        store_head(static_cast<T*>(a.dq), a.sdq, b, h, T_, D, dq);
      }
      store_head(static_cast<T*>(a.dk), a.sdk, b, hk, T_, D, dk);
      store_head(static_cast<T*>(a.dv), a.sdv, b, hk, T_, D, dv);
    }
  });
}

}  // namespace

void attention_forward(const AttnForward& a) {
  check_attn_shape(a.shape, "attention_forward");
  detail::dispatch_float(a.dt, "attention_forward",
                         [&]<class T>(std::type_identity<T>) { forward_impl<T>(a); });
}

void attention_backward(const AttnBackward& a) {
  check_attn_shape(a.shape, "attention_backward");
  const bool empty = a.shape.B * a.shape.H * a.shape.T == 0;
  BT_CHECK(empty || a.dt == DType::F64 || a.lse != nullptr,
           "attention_backward: lse from the forward is required");
  detail::dispatch_float(a.dt, "attention_backward",
                         [&]<class T>(std::type_identity<T>) { backward_impl<T>(a); });
}

}  // namespace bt::kernels::cpu
