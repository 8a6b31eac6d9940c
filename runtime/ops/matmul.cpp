#include "runtime/ops/matmul.h"

#include <algorithm>
#include <optional>

#include "kernels/gemm.h"
#include "runtime/autograd/function.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/autograd/recompute.h"
#include "runtime/core/precision.h"
#include "runtime/ops/dispatch.h"
#include "runtime/ops/gemm_call.h"
#include "runtime/ops/nn/gelu.h"
#include "runtime/ops/reduce.h"
#include "runtime/tensor/factory.h"

namespace bt {
namespace {

using autograd::Grads;
using detail::matmul_raw;
using detail::weight_and_bias_grad;

/// How the last two dims of a tensor map onto a BLAS matrix operand.
struct MatOperand {
  Tensor t;  // possibly a contiguous copy
  bool trans = false;
  int64_t ld = 0;
  int64_t batch_stride = 0;
};

/// Batch dims (all but the last two) must collapse to one uniform stride.
bool uniform_batch(const Tensor& t, int64_t& stride) {
  const int nb = t.dim() - 2;
  stride = 0;
  int64_t expect = -1;
  for (int i = nb - 1; i >= 0; --i) {
    if (t.shape()[i] == 1) continue;
    if (expect >= 0 && t.strides()[i] != expect) return false;
    if (expect < 0) stride = t.strides()[i];
    expect = t.strides()[i] * t.shape()[i];
  }
  return true;
}

MatOperand operand(const Tensor& t_in) {
  MatOperand op;
  op.t = t_in;
  const int r = t_in.dim() - 2, c = t_in.dim() - 1;
  const int64_t rows = t_in.shape()[r], cols = t_in.shape()[c];
  int64_t bs = 0;
  if (uniform_batch(t_in, bs)) {
    if (t_in.strides()[c] == 1 && t_in.strides()[r] >= std::max<int64_t>(cols, 1)) {
      op.ld = t_in.strides()[r];
      op.batch_stride = bs;
      return op;
    }
    if (t_in.strides()[r] == 1 && t_in.strides()[c] >= std::max<int64_t>(rows, 1) && cols > 1) {
      op.trans = true;
      op.ld = t_in.strides()[c];
      op.batch_stride = bs;
      return op;
    }
  }
  op.t = t_in.contiguous();
  op.ld = std::max<int64_t>(cols, 1);
  op.batch_stride = rows * cols;
  return op;
}

constexpr std::initializer_list<DType> kGemmTypes = {DType::F32, DType::F64, DType::BF16};

}  // namespace

namespace detail {

void run_gemm(kernels::GemmArgs& g, const Device& d) {
  if (g.m == 0 || g.n == 0) return;
  g.math = matmul_math(precision());
  detail::on_device(
      d, [&] { kernels::cpu::gemm(g); },
      BT_CUDA_LAMBDA(const int64_t n = static_cast<int64_t>(kernels::cuda::gemm_scratch_floats(g));
                     const Tensor scratch = n > 0 ? empty({n}, TensorOptions{DType::F32, d}) : Tensor();
                     kernels::cuda::gemm(g, stream, n > 0 ? scratch.data<float>() : nullptr)));
}

Tensor matmul_raw(const Tensor& a, const Tensor& b, std::optional<DType> out, Tensor* bias_grad) {
  detail::check_defined("matmul", a, "a");
  detail::check_defined("matmul", b, "b");
  detail::check_same_device("matmul", a, b);
  detail::check_same_dtype("matmul", a, b);
  detail::check_dtype("matmul", a, "a", kGemmTypes);
  BT_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: both operands need at least 2 dimensions, got ",
           shape_str(a.shape()), " and ", shape_str(b.shape()));
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  BT_CHECK(b.size(-2) == K, "matmul: inner dimensions differ: a is ", shape_str(a.shape()), ", b is ",
           shape_str(b.shape()), " (", K, " vs ", b.size(-2), ")");
  const Shape batch(a.shape().begin(), a.shape().end() - 2);
  if (b.dim() > 2) {
    const Shape bb(b.shape().begin(), b.shape().end() - 2);
    BT_CHECK(bb == batch, "matmul: batch dimensions differ: ", shape_str(a.shape()), " vs ",
             shape_str(b.shape()));
  }
  Shape out_shape = batch;
  out_shape.push_back(M);
  out_shape.push_back(N);
  Tensor y = empty(out_shape, a.options().with_dtype(out.value_or(a.dtype())));
  const int64_t nbatch = shape_numel(batch);
  if (y.numel() == 0) return y;
  if (K == 0) return y.zero_();

  kernels::GemmArgs g;
  g.dtype = a.dtype();
  g.c_dtype = out;
  g.m = M;
  g.n = N;
  g.k = K;
  g.c = y.data_ptr();
  g.ldc = N;
  MatOperand oa = operand(a), ob = operand(b);
  if (b.dim() == 2 && nbatch > 1) {
    // Shared right operand: fold the batch into M when a's rows are evenly spaced.
    if (!oa.trans && (oa.batch_stride == M * oa.ld || nbatch == 1)) {
      g.m = M * nbatch;
    } else {
      oa = operand(a.contiguous());
      g.m = M * nbatch;
    }
    g.batch = 1;
  } else {
    g.batch = nbatch;
    g.stride_a = oa.batch_stride;
    g.stride_b = ob.batch_stride;
    g.stride_c = M * N;
  }
  g.a = oa.t.data_ptr();
  g.trans_a = oa.trans;
  g.lda = oa.ld;
  g.b = ob.t.data_ptr();
  g.trans_b = ob.trans;
  g.ldb = ob.ld;
  if (bias_grad) {
    BT_ASSERT(a.dim() == 2 && b.dim() == 2 && bias_grad->numel() == M && bias_grad->dtype() == y.dtype());
    g.bias_grad = bias_grad->data_ptr();
  }
  run_gemm(g, a.device());
  return y;
}

std::pair<Tensor, Tensor> weight_and_bias_grad(const Tensor& gy, const Tensor& x, DType dt, bool bias) {
  if (!bias || gy.numel() == 0 || x.size(1) == 0 || !gy.is_contiguous())
    return {matmul_raw(gy.t(), x, dt), bias ? sum(gy, {0}, false, dt) : Tensor()};
  Tensor gb = empty({gy.size(1)}, gy.options().with_dtype(dt));
  Tensor gw = matmul_raw(gy.t(), x, dt, &gb);
  return {gw, gb};
}

Tensor linear_raw(const Tensor& x, const Tensor& w, const Tensor& bias, Activation act, Tensor* pre) {
  const int64_t rows = x.size(0), in = w.size(1), out = w.size(0);
  Tensor y = empty({rows, out}, x.options());
  if (pre) *pre = act == Activation::Gelu ? empty({rows, out}, x.options()) : Tensor();
  if (rows == 0) return y;
  kernels::GemmArgs g;
  g.dtype = x.dtype();
  g.m = rows;
  g.n = out;
  g.k = in;
  g.a = x.data_ptr();
  g.lda = in;
  g.b = w.data_ptr();
  g.ldb = in;
  g.trans_b = true;
  g.c = y.data_ptr();
  g.ldc = out;
  g.bias = bias.defined() ? bias.data_ptr() : nullptr;
  g.epilogue = act == Activation::Gelu
                   ? (bias.defined() ? kernels::Epilogue::BiasGelu : kernels::Epilogue::Gelu)
                   : (bias.defined() ? kernels::Epilogue::Bias : kernels::Epilogue::None);
  g.pre_gelu = pre && pre->defined() ? pre->data_ptr() : nullptr;
  if (in == 0) {
    y.zero_();
    if (bias.defined()) y.add_(bias);
  } else {
    run_gemm(g, x.device());
  }
  return y;
}

}  // namespace detail

Tensor matmul(const Tensor& a, const Tensor& b) {
  Tensor y = matmul_raw(a, b);
  if (autograd::any_requires_grad({&a, &b}))
    autograd::record(
        "MatmulBackward", {&a, &b}, y,
        [sa = SavedTensor(a, "matmul"), sb = SavedTensor(b, "matmul"), ra = a.requires_grad(),
         rb = b.requires_grad()](Grads& g) -> Grads {
          Tensor a = sa.unpack(), b = sb.unpack();
          Tensor ga, gb;
          if (ra) ga = matmul_raw(g[0], b.transpose(-1, -2));
          if (rb) {
            if (b.dim() == 2 && a.dim() > 2)
              gb = matmul_raw(a.reshape({-1, a.size(-1)}).t(), g[0].reshape({-1, g[0].size(-1)}));
            else
              gb = matmul_raw(a.transpose(-1, -2), g[0]);
          }
          return {ga, gb};
        });
  return y;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, Activation act) {
  detail::check_defined("linear", x, "x");
  detail::check_defined("linear", w, "weight");
  detail::check_same_device("linear", x, w);
  detail::check_same_dtype("linear", x, w);
  detail::check_dtype("linear", x, "x", kGemmTypes);
  detail::check_dim("linear", w, "weight", 2);
  BT_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1), "linear: input features ", x.dim() ? x.size(-1) : 0,
           " (x shape ", shape_str(x.shape()), ") do not match weight shape ", shape_str(w.shape()),
           " [out, in]");
  if (bias.defined()) {
    detail::check_same_device("linear", x, bias);
    detail::check_same_dtype("linear", x, bias);
    BT_CHECK(bias.dim() == 1 && bias.size(0) == w.size(0), "linear: bias shape ", shape_str(bias.shape()),
             " does not match ", w.size(0), " output features");
  }
  const bool need_grad = autograd::any_requires_grad({&x, &w, &bias});
  // The GEMM's GELU epilogue and the GELU kernel may differ in the last bits,
  // and a recompute must rebuild the very values the forward used (Note
  // [Selective recompute]): GELU is its own kernel when selective recompute
  // records a graph, and under full recompute always, since a checkpointed
  // block runs once without and once with a graph, which must agree (Note
  // [Checkpointed regions]). Evaluation under selective keeps the epilogue.
  const Recompute rc = autograd::recompute_mode();
  if (act == Activation::Gelu && (rc == Recompute::Full || (rc == Recompute::Selective && need_grad)))
    return gelu(linear(x, w, bias));
  const int64_t in = w.size(1), out = w.size(0);
  Tensor x2 = x.reshape({-1, in}).contiguous();
  Tensor wc = w.contiguous();
  Tensor bc = bias.defined() ? bias.contiguous() : Tensor();
  Tensor pre;
  Tensor y = detail::linear_raw(x2, wc, bc, act, need_grad ? &pre : nullptr);
  Shape ys = x.shape();
  ys.back() = out;
  y = y.view(ys);
  if (need_grad)
    autograd::record(
        "LinearBackward", {&x, &w, &bias}, y,
        [sx = SavedTensor(x2, "linear"), sw = SavedTensor(wc, "linear"), spre = SavedTensor(pre, "linear"),
         xs = x.shape(), has_bias = bias.defined(), act, in, out](Grads& g) -> Grads {
          Tensor gy = g[0].reshape({-1, out});
          if (act == Activation::Gelu) gy = gelu_backward(spre.unpack(), gy);
          Tensor x2 = sx.unpack(), w = sw.unpack();
          Tensor gx = matmul_raw(gy, w).reshape(xs);
          // Note [Gradients in a wider dtype]: bf16 weights are casts of f32
          // masters, so their gradients are made in f32 by the GEMM and the sum.
          const DType gdt = gy.dtype() == DType::BF16 ? DType::F32 : gy.dtype();
          auto [gw, gb] = weight_and_bias_grad(gy, x2, gdt, has_bias);
          return {gx, gw, gb};
        });
  return y;
}

// Note [One GEMM for several weights]
// Llama's q, k and v projections read the same normed activations through
// three weights; with 4 K/V heads of 12 the k and v GEMMs are a third as wide
// as q's, and narrow GEMMs use the GPU worse. linear_split concatenates the
// weights' rows (a copy of the weights, small next to the activations) and
// runs one GEMM; the outputs are views of its result, read in place by the
// ops after them (strided fusion inputs, attention's strides). Backward
// gathers the outputs' gradients side by side (one copy of them) so that dx
// is one GEMM against the concatenated weights and the weights' gradients are
// one GEMM whose rows each weight takes: against three GEMMs each way and two
// sums of the dx pieces. A missing output gradient counts as zeros.
std::vector<Tensor> linear_split(const Tensor& x, const std::vector<Tensor>& ws) {
  detail::check_defined("linear_split", x, "x");
  detail::check_dtype("linear_split", x, "x", kGemmTypes);
  BT_CHECK(!ws.empty(), "linear_split: no weights");
  BT_CHECK(x.dim() >= 1, "linear_split: x must have at least one dimension");
  const int64_t in = x.size(-1);
  std::vector<int64_t> outs;
  int64_t total = 0;
  for (const Tensor& w : ws) {
    detail::check_defined("linear_split", w, "weight");
    detail::check_same_device("linear_split", x, w);
    detail::check_same_dtype("linear_split", x, w);
    detail::check_dim("linear_split", w, "weight", 2);
    BT_CHECK(w.size(1) == in, "linear_split: input features ", in, " (x shape ", shape_str(x.shape()),
             ") do not match weight shape ", shape_str(w.shape()), " [out, in]");
    outs.push_back(w.size(0));
    total += w.size(0);
  }
  Tensor wc = empty({total, in}, ws[0].options());
  for (size_t i = 0, off = 0; i < ws.size(); off += static_cast<size_t>(outs[i]), ++i) {
    NoGradGuard ng;
    wc.narrow(0, static_cast<int64_t>(off), outs[i]).copy_(ws[i]);
  }
  const Tensor x2 = x.reshape({-1, in}).contiguous();
  Shape ys = x.shape();
  ys.back() = total;
  const Tensor y = detail::linear_raw(x2, wc, Tensor(), Activation::None, nullptr).view(ys);
  std::vector<Tensor> parts;
  for (size_t i = 0, off = 0; i < ws.size(); off += static_cast<size_t>(outs[i]), ++i)
    parts.push_back(y.narrow(y.dim() - 1, static_cast<int64_t>(off), outs[i]));
  std::vector<const Tensor*> inputs{&x};
  for (const Tensor& w : ws) inputs.push_back(&w);
  if (autograd::any_requires_grad({&x}) ||
      std::any_of(ws.begin(), ws.end(), [](const Tensor& w) { return autograd::any_requires_grad({&w}); }))
    autograd::record(
        "LinearSplitBackward", inputs, parts,
        [sx = SavedTensor(x2, "linear_split"), sw = SavedTensor(wc, "linear_split"), xs = x.shape(), outs,
         total](Grads& g) -> Grads {
          const Tensor x2 = sx.unpack(), w = sw.unpack();
          Tensor gy = empty({x2.size(0), total}, x2.options());
          for (size_t i = 0, off = 0; i < outs.size(); off += static_cast<size_t>(outs[i]), ++i) {
            Tensor slot = gy.narrow(1, static_cast<int64_t>(off), outs[i]);
            if (g[i].defined())
              slot.copy_(g[i].reshape({-1, outs[i]}));
            else
              slot.zero_();
          }
          Grads out{matmul_raw(gy, w).reshape(xs)};
          // Note [Gradients in a wider dtype], as linear's.
          const Tensor gw = matmul_raw(gy.t(), x2, gy.dtype() == DType::BF16 ? DType::F32 : gy.dtype());
          for (size_t i = 0, off = 0; i < outs.size(); off += static_cast<size_t>(outs[i]), ++i)
            out.push_back(gw.narrow(0, static_cast<int64_t>(off), outs[i]));
          return out;
        });
  return parts;
}

}  // namespace bt
