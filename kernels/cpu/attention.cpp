// CPU causal attention, memory-efficient form (F32, F64, BF16).
//
// Forward, per query row i: a streaming (online) softmax over keys j <= i,
// rescaling the running output when the running max grows; writes
// o = sum_j p_j v_j and lse = max + log(sum_j exp(s_j - max)).
// Backward, per (b, h): recomputes P = exp(s - lse) row by row and accumulates
// dq, dk, dv in compute-type buffers, which are then stored (every element of
// dq/dk/dv is written). For F64 the backward recomputes lse in double instead
// of using the float lse, so F64 gradients stay accurate to double precision.
#include "kernels/attention.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "kernels/cpu/dispatch.h"

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

template <class A>
inline A dot(const A* x, const A* y, int64_t n) {
  A s = 0;
  for (int64_t d = 0; d < n; ++d) s += x[d] * y[d];
  return s;
}

template <class T>
void forward_impl(const AttnForward& a) {
  using A = acc_t<T>;
  const auto [B, H, T_, D] = a.shape;
  const A scale = static_cast<A>(a.scale);
  std::vector<A> q, k, v, o(static_cast<size_t>(T_ * D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      load_head(static_cast<const T*>(a.q), a.sq, b, h, T_, D, q);
      load_head(static_cast<const T*>(a.k), a.sk, b, h, T_, D, k);
      load_head(static_cast<const T*>(a.v), a.sv, b, h, T_, D, v);
      for (int64_t i = 0; i < T_; ++i) {
        A* oi = o.data() + i * D;
        A mx = -std::numeric_limits<A>::infinity(), sum = 0;
        for (int64_t d = 0; d < D; ++d) oi[d] = 0;
        for (int64_t j = 0; j <= i; ++j) {
          const A s = scale * dot(q.data() + i * D, k.data() + j * D, D);
          if (s > mx) {  // rescale what was accumulated under the old max
            const A c = std::exp(mx - s);
            sum *= c;
            for (int64_t d = 0; d < D; ++d) oi[d] *= c;
            mx = s;
          }
          const A p = std::exp(s - mx);
          sum += p;
          for (int64_t d = 0; d < D; ++d) oi[d] += p * v[j * D + d];
        }
        for (int64_t d = 0; d < D; ++d) oi[d] /= sum;
        if (a.lse) a.lse[(b * H + h) * T_ + i] = static_cast<float>(mx + std::log(sum));
      }
      store_head(static_cast<T*>(a.o), a.so, b, h, T_, D, o);
    }
}

template <class T>
void backward_impl(const AttnBackward& a) {
  using A = acc_t<T>;
  const auto [B, H, T_, D] = a.shape;
  const A scale = static_cast<A>(a.scale);
  const size_t TD = static_cast<size_t>(T_ * D);
  std::vector<A> q, k, v, o, dO, dq(TD), dk(TD), dv(TD), lse(static_cast<size_t>(T_));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      load_head(static_cast<const T*>(a.q), a.sq, b, h, T_, D, q);
      load_head(static_cast<const T*>(a.k), a.sk, b, h, T_, D, k);
      load_head(static_cast<const T*>(a.v), a.sv, b, h, T_, D, v);
      load_head(static_cast<const T*>(a.o), a.so, b, h, T_, D, o);
      load_head(static_cast<const T*>(a.dout), a.sdo, b, h, T_, D, dO);
      std::fill(dq.begin(), dq.end(), A(0));
      std::fill(dk.begin(), dk.end(), A(0));
      std::fill(dv.begin(), dv.end(), A(0));
      for (int64_t i = 0; i < T_; ++i) {
        if constexpr (std::is_same_v<A, double>) {  // recompute lse exactly
          A mx = -std::numeric_limits<A>::infinity(), sum = 0;
          for (int64_t j = 0; j <= i; ++j)
            mx = std::max(mx, scale * dot(q.data() + i * D, k.data() + j * D, D));
          for (int64_t j = 0; j <= i; ++j)
            sum += std::exp(scale * dot(q.data() + i * D, k.data() + j * D, D) - mx);
          lse[i] = mx + std::log(sum);
        } else {
          lse[i] = a.lse[(b * H + h) * T_ + i];
        }
      }
      for (int64_t i = 0; i < T_; ++i) {
        const A* qi = q.data() + i * D;
        const A* doi = dO.data() + i * D;
        A* dqi = dq.data() + i * D;
        const A Di = dot(doi, o.data() + i * D, D);
        for (int64_t j = 0; j <= i; ++j) {
          const A* kj = k.data() + j * D;
          const A p = std::exp(scale * dot(qi, kj, D) - lse[i]);
          const A ds = p * (dot(doi, v.data() + j * D, D) - Di);
          const A sds = scale * ds;
          A* dkj = dk.data() + j * D;
          A* dvj = dv.data() + j * D;
          for (int64_t d = 0; d < D; ++d) {
            dqi[d] += sds * kj[d];
            dkj[d] += sds * qi[d];
            dvj[d] += p * doi[d];
          }
        }
      }
      store_head(static_cast<T*>(a.dq), a.sdq, b, h, T_, D, dq);
      store_head(static_cast<T*>(a.dk), a.sdk, b, h, T_, D, dk);
      store_head(static_cast<T*>(a.dv), a.sdv, b, h, T_, D, dv);
    }
}

void check_shape(const char* kernel, const AttnShape& s) {
  BT_CHECK(s.B >= 0 && s.H >= 0 && s.T >= 0 && s.D >= 0, kernel, ": negative shape [B=", s.B, ", H=", s.H,
           ", T=", s.T, ", D=", s.D, "]");
}

}  // namespace

void attention_forward(const AttnForward& a) {
  check_shape("attention_forward", a.shape);
  detail::dispatch_float(a.dt, "attention_forward",
                         [&]<class T>(std::type_identity<T>) { forward_impl<T>(a); });
}

void attention_backward(const AttnBackward& a) {
  check_shape("attention_backward", a.shape);
  const bool empty = a.shape.B * a.shape.H * a.shape.T == 0;
  BT_CHECK(empty || a.dt == DType::F64 || a.lse != nullptr,
           "attention_backward: lse from the forward is required");
  detail::dispatch_float(a.dt, "attention_backward",
                         [&]<class T>(std::type_identity<T>) { backward_impl<T>(a); });
}

}  // namespace bt::kernels::cpu
