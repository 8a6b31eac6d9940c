#include "runtime/ops/attention.h"

#include <cmath>

#include "kernels/attention.h"
#include "runtime/autograd/function.h"
#include "runtime/ops/dispatch.h"
#include "runtime/tensor/factory.h"

namespace bt {
namespace {

/// A [B, H, T, D] operand with unit stride on D (copied if needed).
Tensor bhtd(const Tensor& t) { return t.strides()[3] == 1 ? t : t.contiguous(); }

kernels::AttnStrides strides_of(const Tensor& t) { return {t.strides()[0], t.strides()[1], t.strides()[2]}; }

/// Fills the fields AttnForward and AttnBackward share: dtype, shape, scale, q/k/v/o.
template <typename Args>
Args attn_args(const kernels::AttnShape& s, float scale, const Tensor& q, const Tensor& k, const Tensor& v,
               const Tensor& o) {
  Args a;
  a.dt = q.dtype();
  a.shape = s;
  a.scale = scale;
  a.q = q.data_ptr();
  a.sq = strides_of(q);
  a.k = k.data_ptr();
  a.sk = strides_of(k);
  a.v = v.data_ptr();
  a.sv = strides_of(v);
  a.o = o.data_ptr();
  a.so = strides_of(o);
  return a;
}

}  // namespace

Tensor causal_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, double scale) {
  for (const Tensor* t : {&q_in, &k_in, &v_in}) {
    detail::check_defined("causal_attention", *t, "q/k/v");
    detail::check_dim("causal_attention", *t, "q/k/v", 4);
    detail::check_same_device("causal_attention", q_in, *t);
    detail::check_same_dtype("causal_attention", q_in, *t);
    BT_CHECK(t->shape() == q_in.shape(),
             "causal_attention: q, k and v must have one shape [B, H, T, D]; got ", shape_str(q_in.shape()),
             " and ", shape_str(t->shape()));
  }
  detail::check_dtype("causal_attention", q_in, "q", {DType::F32, DType::F64, DType::BF16});
  Tensor q = bhtd(q_in), k = bhtd(k_in), v = bhtd(v_in);
  kernels::AttnShape s{q.size(0), q.size(1), q.size(2), q.size(3)};
  const float sc =
      static_cast<float>(scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(s.D, 1))));
  Tensor o = empty(q.shape(), q.options());
  Tensor lse = empty({s.B, s.H, s.T}, TensorOptions{DType::F32, q.device()});
  auto f = attn_args<kernels::AttnForward>(s, sc, q, k, v, o);
  f.lse = lse.data<float>();
  if (o.numel() > 0)
    detail::on_device(
        q.device(), [&] { kernels::cpu::attention_forward(f); },
        BT_CUDA_LAMBDA(kernels::cuda::attention_forward(f, stream)));
  if (autograd::any_requires_grad({&q_in, &k_in, &v_in}))
    autograd::record(
        "CausalAttentionBackward", {&q_in, &k_in, &v_in}, o,
        [sq = SavedTensor(q, "causal_attention"), sk = SavedTensor(k, "causal_attention"),
         sv = SavedTensor(v, "causal_attention"), so = SavedTensor(o, "causal_attention"),
         sl = SavedTensor(lse, "causal_attention"), s, sc](autograd::Grads& g) -> autograd::Grads {
          Tensor q = sq.unpack(), k = sk.unpack(), v = sv.unpack(), o = so.unpack(), lse = sl.unpack();
          Tensor dout = bhtd(g[0]);
          Tensor dq = empty(q.shape(), q.options()), dk = empty(q.shape(), q.options()),
                 dv = empty(q.shape(), q.options());
          auto b = attn_args<kernels::AttnBackward>(s, sc, q, k, v, o);
          b.dout = dout.data_ptr();
          b.sdo = strides_of(dout);
          b.lse = lse.data<float>();
          b.dq = dq.data_ptr();
          b.sdq = strides_of(dq);
          b.dk = dk.data_ptr();
          b.sdk = strides_of(dk);
          b.dv = dv.data_ptr();
          b.sdv = strides_of(dv);
          if (q.numel() > 0)
            detail::on_device(
                q.device(), [&] { kernels::cpu::attention_backward(b); },
                BT_CUDA_LAMBDA(
                    Tensor scratch =
                        empty({static_cast<int64_t>(kernels::cuda::attention_backward_scratch_floats(s))},
                              TensorOptions{DType::F32, q.device()});
                    kernels::cuda::attention_backward(b, scratch.data<float>(), stream)));
          return {dq, dk, dv};
        });
  return o;
}

}  // namespace bt
