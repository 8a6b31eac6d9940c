#include "runtime/ops/nn/mlp.h"

#include <algorithm>
#include <tuple>

#include "kernels/gelu.h"
#include "kernels/gemm.h"
#include "runtime/autograd/function.h"
#include "runtime/autograd/recompute.h"
#include "runtime/ops/dispatch.h"
#include "runtime/ops/gemm_call.h"
#include "runtime/ops/nn/gelu.h"
#include "runtime/tensor/factory.h"

namespace bt {

// Note [Fused MLP backward]
// GPT-2's MLP is y = h W2^T + b2 with h = gelu(pre), pre = x W1^T + b1. Run
// as two linears and a GELU, its backward makes dH = dY W2 (a GEMM), then
// dPre = gelu'(pre) * dH (the GELU backward kernel), then b1's gradient (a
// column-sum pass) and the first layer's GEMMs. As one op it runs dH's plain
// GEMM, then one pass over pre and dH (gelu_grad_in_place, Note [The MLP's
// GELU backward in one pass] in kernels/cuda/gelu.cu) that turns dH into
// dPre, sums dPre's columns into b1's gradient and, where selective
// recompute dropped h, rebuilds h with the bits gelu() gives. W2's gradients
// follow, from that h, then W1's and x's from dPre. This holds dPre and h
// together for the span of W2's weight-gradient GEMM (GPT-2's bf16 step peak
// stayed at 6.21 GiB). dPre is rounded from dH in the activations' dtype, as
// the unfused ops and PyTorch's GELU backward round it.
//   cuBLASLt could take the GELU's derivative and b1's gradient in dH's
// GEMM's epilogue (DGeluBgrad, Note [GELU-gradient epilogue] in
// kernels/gemm.h), so that dH is never stored. That order (W2's gradients
// first, h dropped before dPre is made) is what F64 runs, the CPU's gradient
// checks: the one pass has no F64 (b1's gradient comes out in F32). In F32
// and BF16 it loses on the GPU: cuBLASLt runs the DGELU epilogue in slower
// kernels than its plain GEMMs, or in f32 as a pass of its own after them.
// For GPT-2's 16384 x 3072 x 768 on an H200 (bench/RESULTS.md, issue 18 steps
// 15 and 17): in bf16 166 us for the DGELU GEMM, 55 for h's rebuild and 27
// for the sums, against 110 for the plain GEMM and 123 for the pass; in
// strict fp32 cuBLASLt's passes for the GELU epilogues, forward and
// backward, took 262 us a layer each, against 144 for this pass and 99 for
// the GELU kernel of the forward below. The whole step gained 1.1% in strict
// fp32, 2.8% in tf32 and 1.9% in fp32x3.
//   The forward is the one the two linears run (runtime/ops/matmul.cpp).
// When gradients are needed in F32, and in every dtype under full recompute
// or selective recompute, GELU is its own kernel on pre: under recompute so
// that h's recipe -- the same kernel on the saved pre, Note [Selective
// recompute] -- rebuilds its bits (Note [Checkpointed regions]), and in F32
// because cuBLASLt's f32 GELU_AUX_BIAS epilogue is slower than a bias GEMM
// and the GELU kernel (0.2-0.6% of a step on top of the backward above).
// Otherwise the GEMM's GELU epilogue writes h and, for the backward, pre.
// bf16 operands give f32 weight and bias gradients straight from the GEMMs
// (c_dtype) and the pass, and a bf16 input gradient (Note [Gradients in a
// wider dtype], runtime/autograd/engine.cpp).

namespace {

using autograd::Grads;

/// dPre = gelu'(pre) * (dY W2) for dY [rows, out], W2 [out, hidden] and pre
/// [rows, hidden], all contiguous; with `bias_grad` ([hidden], in its dtype),
/// also the column sums of dPre: one GEMM, the F64 order of Note [Fused MLP
/// backward].
Tensor gelu_grad_matmul(const Tensor& gy, const Tensor& w, const Tensor& pre, Tensor* bias_grad) {
  const int64_t rows = gy.size(0), out = w.size(0), hidden = w.size(1);
  BT_ASSERT(gy.is_contiguous() && w.is_contiguous() && pre.is_contiguous() && pre.dtype() == gy.dtype() &&
            w.dtype() == gy.dtype() && pre.size(0) == rows && pre.size(1) == hidden);
  Tensor dpre = empty({rows, hidden}, gy.options());
  if (rows == 0) {
    if (bias_grad) bias_grad->zero_();
    return dpre;
  }
  kernels::GemmArgs g;
  g.dtype = gy.dtype();
  g.m = rows;
  g.n = hidden;
  g.k = out;
  g.a = gy.data_ptr();
  g.lda = std::max<int64_t>(out, 1);
  g.b = w.data_ptr();
  g.ldb = hidden;
  g.c = dpre.data_ptr();
  g.ldc = hidden;
  g.epilogue = bias_grad ? kernels::Epilogue::DGeluBgrad : kernels::Epilogue::DGelu;
  g.gelu_in = pre.data_ptr();
  g.ld_gelu_in = hidden;
  if (bias_grad) {
    g.bias_grad = bias_grad->data_ptr();
    if (bias_grad->dtype() != g.dtype) g.bias_grad_dtype = bias_grad->dtype();
  }
  detail::run_gemm(g, gy.device());
  return dpre;
}

/// dh (dL/dh, [rows, hidden], contiguous) becomes dPre = dh * gelu'(pre) in
/// place; h, when asked, receives gelu(pre), the bits gelu() gives; the
/// result is dPre's column sums in F32 when asked (b1's gradient), else
/// undefined (Note [The MLP's GELU backward in one pass]).
Tensor gelu_grad_in_place(const Tensor& pre, const Tensor& dh, Tensor* h, bool bias) {
  BT_ASSERT(pre.is_contiguous() && dh.is_contiguous() && pre.shape() == dh.shape() && dh.dim() == 2 &&
            pre.dtype() == dh.dtype());
  const int64_t rows = dh.size(0), hidden = dh.size(1);
  if (h) *h = empty(dh.shape(), dh.options());
  Tensor gb = bias ? empty({hidden}, dh.options().with_dtype(DType::F32)) : Tensor();
  detail::on_device(
      dh.device(),
      [&] {
        kernels::cpu::gelu_backward_fused(dh.dtype(), pre.data_ptr(), dh.data_ptr(),
                                          h ? h->data_ptr() : nullptr, bias ? gb.data<float>() : nullptr,
                                          rows, hidden);
      },
      BT_CUDA_LAMBDA({
        const size_t n = bias ? kernels::cuda::gelu_backward_fused_scratch_floats(rows, hidden) : 0;
        Tensor scratch =
            n ? empty({static_cast<int64_t>(n)}, TensorOptions{DType::F32, dh.device()}) : Tensor();
        kernels::cuda::gelu_backward_fused(dh.dtype(), pre.data_ptr(), dh.data_ptr(),
                                           h ? h->data_ptr() : nullptr, bias ? gb.data<float>() : nullptr,
                                           rows, hidden, n ? scratch.data<float>() : nullptr, stream);
      }));
  return gb;
}

void check_layer(const Tensor& x, const Tensor& w, const Tensor& b, const char* w_name, const char* b_name) {
  detail::check_defined("mlp", w, w_name);
  detail::check_same_device("mlp", x, w);
  detail::check_same_dtype("mlp", x, w);
  detail::check_dim("mlp", w, w_name, 2);
  if (!b.defined()) return;
  detail::check_same_device("mlp", x, b);
  detail::check_same_dtype("mlp", x, b);
  BT_CHECK(b.dim() == 1 && b.size(0) == w.size(0), "mlp: ", b_name, " shape ", shape_str(b.shape()),
           " does not match the ", w.size(0), " output features of ", w_name, " ", shape_str(w.shape()));
}

}  // namespace

Tensor mlp(const Tensor& x, const Tensor& fc_w, const Tensor& fc_b, const Tensor& out_w,
           const Tensor& out_b) {
  detail::check_defined("mlp", x, "x");
  detail::check_dtype("mlp", x, "x", {DType::F32, DType::F64, DType::BF16});
  check_layer(x, fc_w, fc_b, "fc_w", "fc_b");
  check_layer(x, out_w, out_b, "out_w", "out_b");
  BT_CHECK(x.dim() >= 1 && x.size(-1) == fc_w.size(1), "mlp: input features ", x.dim() ? x.size(-1) : 0,
           " (x shape ", shape_str(x.shape()), ") do not match fc_w shape ", shape_str(fc_w.shape()),
           " [hidden, in]");
  BT_CHECK(out_w.size(1) == fc_w.size(0), "mlp: out_w shape ", shape_str(out_w.shape()),
           " [out, hidden] does not take the ", fc_w.size(0), " hidden features of fc_w ",
           shape_str(fc_w.shape()));
  const bool need_grad = autograd::any_requires_grad({&x, &fc_w, &fc_b, &out_w, &out_b});
  const Recompute rc = autograd::recompute_mode();
  // Note [Fused MLP backward]: the GELU kernel under recompute, and for F32's backward.
  const bool gelu_kernel =
      rc == Recompute::Full || (need_grad && (rc == Recompute::Selective || x.dtype() == DType::F32));
  const int64_t in = fc_w.size(1), hidden = fc_w.size(0), out = out_w.size(0);
  Tensor x2 = x.reshape({-1, in}).contiguous();
  Tensor w1 = fc_w.contiguous(), w2 = out_w.contiguous();
  Tensor b1 = fc_b.defined() ? fc_b.contiguous() : Tensor(),
         b2 = out_b.defined() ? out_b.contiguous() : Tensor();
  Tensor pre, h;
  if (gelu_kernel) {
    pre = detail::linear_raw(x2, w1, b1, Activation::None);
    h = gelu(pre);  // pre needs no gradient: not recorded
  } else {
    h = detail::linear_raw(x2, w1, b1, Activation::Gelu, need_grad ? &pre : nullptr);
  }
  Tensor y = detail::linear_raw(h, w2, b2, Activation::None);
  Shape ys = x.shape();
  ys.back() = out;
  y = y.view(ys);
  if (!need_grad) return y;
  autograd::make_recomputable(h, [sp = SavedTensor(pre, "mlp")] { return gelu(sp.unpack()); });
  autograd::record("MlpBackward", {&x, &fc_w, &fc_b, &out_w, &out_b}, y,
                   [sx = SavedTensor(x2, "mlp"), sw1 = SavedTensor(w1, "mlp"), spre = SavedTensor(pre, "mlp"),
                    sh = SavedTensor(h, "mlp"), sw2 = SavedTensor(w2, "mlp"), xs = x.shape(),
                    has_b1 = fc_b.defined(), has_b2 = out_b.defined(), hidden, out](Grads& g) -> Grads {
                     Tensor gy = g[0].reshape({-1, out}).contiguous();
                     // Note [Gradients in a wider dtype]: f32 gradients for bf16 copies of f32 masters.
                     const DType gdt = gy.dtype() == DType::BF16 ? DType::F32 : gy.dtype();
                     if (gy.dtype() != DType::F64) {
                       // Note [Fused MLP backward]: a plain GEMM, then one pass.
                       Tensor dpre = detail::matmul_raw(gy, sw2.unpack());
                       Tensor h = sh.recomputed() ? Tensor() : sh.unpack();
                       Tensor gb1 =
                           gelu_grad_in_place(spre.unpack(), dpre, h.defined() ? nullptr : &h, has_b1);
                       auto [gw2, gb2] = detail::weight_and_bias_grad(gy, h, gdt, has_b2);
                       h = Tensor();
                       Tensor gw1 = detail::matmul_raw(dpre.t(), sx.unpack(), gdt);
                       Tensor gx = detail::matmul_raw(dpre, sw1.unpack()).reshape(xs);
                       return {gx, gw1, gb1, gw2, gb2};
                     }
                     // F64: W2's gradients first; h (rebuilt under selective recompute) is
                     // dropped before dPre is made (Note [Fused MLP backward]).
                     Tensor gw2, gb2;
                     std::tie(gw2, gb2) = detail::weight_and_bias_grad(gy, sh.unpack(), gdt, has_b2);
                     Tensor gb1 = has_b1 ? empty({hidden}, gy.options().with_dtype(gdt)) : Tensor();
                     Tensor dpre = gelu_grad_matmul(gy, sw2.unpack(), spre.unpack(), has_b1 ? &gb1 : nullptr);
                     Tensor gw1 = detail::matmul_raw(dpre.t(), sx.unpack(), gdt);
                     Tensor gx = detail::matmul_raw(dpre, sw1.unpack()).reshape(xs);
                     return {gx, gw1, gb1, gw2, gb2};
                   });
  return y;
}

}  // namespace bt
