#include "runtime/ops/nn/attention.h"

#include <cmath>

#include "kernels/attention.h"
#include "runtime/autograd/function.h"
#include "runtime/core/precision.h"
#include "runtime/ops/dispatch.h"
#include "runtime/tensor/factory.h"

namespace bt {
namespace {

/// A 4-d operand with unit stride on D, its last dim (copied if needed).
Tensor bhtd(const Tensor& t) { return t.strides()[3] == 1 ? t : t.contiguous(); }

kernels::AttnStrides strides_of(const Tensor& t) { return {t.strides()[0], t.strides()[1], t.strides()[2]}; }

/// A [B, H, T, D] operand inside some buffer: its first element and strides.
struct Operand {
  void* p;
  kernels::AttnStrides s;
};

Operand of(const Tensor& t) { return {t.data_ptr(), strides_of(t)}; }

/// A [B, T, heads, D] tensor as a [B, heads, T, D] operand (strides swapped, no copy).
Operand of_bthd(const Tensor& t) { return {t.data_ptr(), {t.strides()[0], t.strides()[2], t.strides()[1]}}; }

/// Fills the fields AttnForward and AttnBackward share: dtype, math (the
/// policy's attention_math), shape, scale, q/k/v/o.
template <typename Args>
Args attn_args(DType dt, kernels::GemmMath math, const kernels::AttnShape& s, float scale, Operand q,
               Operand k, Operand v, Operand o) {
  Args a;
  a.dt = dt;
  a.math = math;
  a.shape = s;
  a.scale = scale;
  a.q = q.p;
  a.sq = q.s;
  a.k = k.p;
  a.sk = k.s;
  a.v = v.p;
  a.sv = v.s;
  a.o = o.p;
  a.so = o.s;
  return a;
}

float default_scale(double scale, int64_t D) {
  return static_cast<float>(scale > 0 ? scale
                                      : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(D, 1))));
}

/// Runs the forward kernel; returns lse [B, H, T].
Tensor forward(DType dt, kernels::GemmMath math, const Device& dev, const kernels::AttnShape& s, float sc,
               Operand q, Operand k, Operand v, Operand o) {
  Tensor lse = empty({s.B, s.H, s.T}, TensorOptions{DType::F32, dev});
  auto f = attn_args<kernels::AttnForward>(dt, math, s, sc, q, k, v, o);
  f.lse = lse.data<float>();
  if (s.B * s.H * s.T * s.D > 0)
    detail::on_device(
        dev, [&] { kernels::cpu::attention_forward(f); },
        BT_CUDA_LAMBDA(kernels::cuda::attention_forward(f, stream)));
  return lse;
}

/// Runs the backward kernels, writing every element of dq, dk and dv.
void backward(DType dt, kernels::GemmMath math, const Device& dev, const kernels::AttnShape& s, float sc,
              Operand q, Operand k, Operand v, Operand o, Operand dout, const Tensor& lse, Operand dq,
              Operand dk, Operand dv) {
  auto b = attn_args<kernels::AttnBackward>(dt, math, s, sc, q, k, v, o);
  b.dout = dout.p;
  b.sdo = dout.s;
  b.lse = lse.data<float>();
  b.dq = dq.p;
  b.sdq = dq.s;
  b.dk = dk.p;
  b.sdk = dk.s;
  b.dv = dv.p;
  b.sdv = dv.s;
  if (s.B * s.H * s.T * s.D == 0) return;
  detail::on_device(
      dev, [&] { kernels::cpu::attention_backward(b); },
      BT_CUDA_LAMBDA(const size_t floats = kernels::cuda::attention_backward_scratch_floats(b);
                     Tensor scratch = empty({static_cast<int64_t>(floats)}, TensorOptions{DType::F32, dev});
                     kernels::cuda::attention_backward(b, scratch.data<float>(), stream, floats)));
}

}  // namespace

namespace {

/// causal_attention (bthd false: [B, H, T, D] operands) and
/// grouped_query_attention (bthd true: [B, T, H, D]); k and v have Hkv heads.
Tensor attention(const char* op, const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, double scale,
                 bool bthd) {
  const int hd = bthd ? 2 : 1, td = bthd ? 1 : 2;  // the head and time dims
  const char* layout = bthd ? "[B, T, heads, D]" : "[B, heads, T, D]";
  for (const Tensor* t : {&q_in, &k_in, &v_in}) {
    detail::check_defined(op, *t, "q/k/v");
    detail::check_dim(op, *t, "q/k/v", 4);
    detail::check_same_device(op, q_in, *t);
    detail::check_same_dtype(op, q_in, *t);
  }
  detail::check_dtype(op, q_in, "q", {DType::F32, DType::F64, DType::BF16});
  BT_CHECK(k_in.shape() == v_in.shape(), op, ": k and v must have one shape ", layout, "; got ",
           shape_str(k_in.shape()), " and ", shape_str(v_in.shape()));
  BT_CHECK(k_in.size(0) == q_in.size(0) && k_in.size(td) == q_in.size(td) && k_in.size(3) == q_in.size(3), op,
           ": q, k and v must have one shape ", layout, " but for the number of heads; got q ",
           shape_str(q_in.shape()), " and k, v ", shape_str(k_in.shape()));
  const int64_t H = q_in.size(hd), Hkv = k_in.size(hd);
  BT_CHECK(Hkv > 0 ? H % Hkv == 0 : H == 0, op, ": the ", Hkv, " key/value heads of k and v must divide the ",
           H, " query heads of q (each key/value head serves H / Hkv query heads)");
  Tensor q = bhtd(q_in), k = bhtd(k_in), v = bhtd(v_in);
  const auto op_of = [bthd](const Tensor& t) { return bthd ? of_bthd(t) : of(t); };
  const kernels::AttnShape s{q.size(0), H, q.size(td), q.size(3), Hkv};
  const float sc = default_scale(scale, s.D);
  Tensor o = empty(q.shape(), q.options());
  // The backward multiplies as the forward did, whatever the policy is by then.
  const kernels::GemmMath math = attention_math(precision());
  Tensor lse = forward(q.dtype(), math, q.device(), s, sc, op_of(q), op_of(k), op_of(v), op_of(o));
  if (autograd::any_requires_grad({&q_in, &k_in, &v_in}))
    autograd::record(
        bthd ? "GroupedQueryAttentionBackward" : "CausalAttentionBackward", {&q_in, &k_in, &v_in}, o,
        [sq = SavedTensor(q, op), sk = SavedTensor(k, op), sv = SavedTensor(v, op), so = SavedTensor(o, op),
         sl = SavedTensor(lse, op), s, sc, math, op_of](autograd::Grads& g) -> autograd::Grads {
          Tensor q = sq.unpack(), k = sk.unpack(), v = sv.unpack(), o = so.unpack();
          Tensor dout = bhtd(g[0]);
          Tensor dq = empty(q.shape(), q.options()), dk = empty(k.shape(), k.options()),
                 dv = empty(v.shape(), v.options());
          backward(q.dtype(), math, q.device(), s, sc, op_of(q), op_of(k), op_of(v), op_of(o), op_of(dout),
                   sl.unpack(), op_of(dq), op_of(dk), op_of(dv));
          return {dq, dk, dv};
        });
  return o;
}

}  // namespace

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  return attention("causal_attention", q, k, v, scale, false);
}

Tensor grouped_query_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  return attention("grouped_query_attention", q, k, v, scale, true);
}

}  // namespace bt

namespace bt {
namespace {

/// Head h of the q (part 0), k (1) or v (2) third of a contiguous [B, T, 3C]
/// buffer, as a [B, H, T, D] operand.
Operand qkv_part(const Tensor& qkv, int part, int64_t T, int64_t C, int64_t D) {
  char* base = static_cast<char*>(qkv.data_ptr()) + part * C * static_cast<int64_t>(dtype_size(qkv.dtype()));
  return {base, {T * 3 * C, D, 3 * C}};
}

/// A contiguous [B, T, C] buffer as a [B, H, T, D] operand (heads side by side).
Operand merged(const Tensor& t, int64_t T, int64_t C, int64_t D) { return {t.data_ptr(), {T * C, D, C}}; }

}  // namespace

Tensor causal_self_attention(const Tensor& qkv_in, int64_t n_head, double scale) {
  detail::check_defined("causal_self_attention", qkv_in, "qkv");
  detail::check_dim("causal_self_attention", qkv_in, "qkv", 3);
  detail::check_dtype("causal_self_attention", qkv_in, "qkv", {DType::F32, DType::F64, DType::BF16});
  const int64_t B = qkv_in.size(0), T = qkv_in.size(1), C3 = qkv_in.size(2);
  BT_CHECK(n_head > 0 && C3 % (3 * n_head) == 0, "causal_self_attention: the last dim of qkv (", C3,
           ") must be 3 x n_head (", n_head, ") x head size");
  const int64_t C = C3 / 3, D = C / n_head;
  Tensor qkv = qkv_in.contiguous();
  const kernels::AttnShape s{B, n_head, T, D};
  const float sc = default_scale(scale, D);
  Tensor o = empty({B, T, C}, qkv.options());
  const kernels::GemmMath math = attention_math(precision());  // the backward's too
  Tensor lse = forward(qkv.dtype(), math, qkv.device(), s, sc, qkv_part(qkv, 0, T, C, D),
                       qkv_part(qkv, 1, T, C, D), qkv_part(qkv, 2, T, C, D), merged(o, T, C, D));
  if (autograd::any_requires_grad({&qkv_in}))
    autograd::record(
        "CausalSelfAttentionBackward", {&qkv_in}, o,
        [sq = SavedTensor(qkv, "causal_self_attention"), so = SavedTensor(o, "causal_self_attention"),
         sl = SavedTensor(lse, "causal_self_attention"), s, sc, math, T, C,
         D](autograd::Grads& g) -> autograd::Grads {
          Tensor qkv = sq.unpack(), o = so.unpack();
          Tensor dout = g[0].contiguous();
          Tensor dqkv = empty(qkv.shape(), qkv.options());  // every element written below
          backward(qkv.dtype(), math, qkv.device(), s, sc, qkv_part(qkv, 0, T, C, D),
                   qkv_part(qkv, 1, T, C, D), qkv_part(qkv, 2, T, C, D), merged(o, T, C, D),
                   merged(dout, T, C, D), sl.unpack(), qkv_part(dqkv, 0, T, C, D), qkv_part(dqkv, 1, T, C, D),
                   qkv_part(dqkv, 2, T, C, D));
          return {dqkv};
        });
  return o;
}

}  // namespace bt
