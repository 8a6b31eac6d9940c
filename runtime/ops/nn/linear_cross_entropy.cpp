#include "runtime/ops/nn/linear_cross_entropy.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "kernels/common/env.h"
#include "kernels/cross_entropy.h"
#include "kernels/gemm.h"
#include "runtime/autograd/engine.h"
#include "runtime/autograd/function.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/core/precision.h"
#include "runtime/ops/dispatch.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/gemm_call.h"
#include "runtime/ops/nn/cross_entropy.h"
#include "runtime/ops/reduce.h"
#include "runtime/tensor/factory.h"

namespace bt {

// Note [The LM head in row chunks]
// The logits (rows x padded vocabulary: 16384 x 50304 for GPT-2 at 16 x 1024
// tokens, 3.3 GB in f32) are the largest tensor of a step, and the loss is
// their only reader. So the head and the loss run chunk by chunk of rows:
// for each chunk the GEMM makes its logits into one buffer, the cross-entropy
// kernel turns them into their loss and, in the same pass, their gradient for
// an incoming gradient of grad_hint (Note [Gradient in the forward pass]);
// then dX's rows of the chunk = dlogits W, and dW += dlogits^T X (the GEMM's
// beta = 1 after the first chunk). Only one chunk's logits ever exist; dX and
// dW wait for the backward, which rescales them (on the device, no host read)
// if the incoming gradient is not the hint. The arithmetic per row is the
// unchunked path's except dW's sum over rows, now added chunk after chunk in
// a fixed order: deterministic, not the same bits.

namespace {

/// C (ldc = n) = alpha op(A) op(B) + beta C for row-major operands, on the
/// precision policy's math; `c_dt` when C is wider than A and B (bf16 -> f32).
void gemm_into(void* c, DType c_dt, const Tensor& ref, const void* a, bool ta, int64_t lda, const void* b,
               bool tb, int64_t ldb, int64_t m, int64_t n, int64_t k, float beta) {
  kernels::GemmArgs g;
  g.dtype = ref.dtype();
  if (c_dt != ref.dtype()) g.c_dtype = c_dt;
  g.m = m, g.n = n, g.k = k;
  g.a = a, g.trans_a = ta, g.lda = lda;
  g.b = b, g.trans_b = tb, g.ldb = ldb;
  g.c = c, g.ldc = n;
  g.beta = beta;
  detail::run_gemm(g, ref.device());
}

/// g *= incoming / hint unless incoming == hint, incoming read on the device.
void rescale(Tensor& g, const Tensor& incoming, float hint) {
  detail::on_device(
      g.device(),
      [&] {
        const float gv = incoming.item<float>();
        if (gv != hint) g.mul_(static_cast<double>(gv / hint));
      },
      BT_CUDA_LAMBDA(kernels::cuda::cross_entropy_rescale(g.dtype(), g.data_ptr(), g.numel(),
                                                          incoming.data<float>(), hint, stream)));
  g.bump_version();
}

}  // namespace

int64_t lm_head_chunk_rows(int64_t vp, DType dt, kernels::GemmMath math) {
  // Note [Chunk budgets]: measured on an H100 (bench/RESULTS.md, step 8), the
  // chunks cost time through the GEMMs' shapes: 2 GiB (two chunks of GPT-2's
  // f32 logits at 16K rows) costs nothing in tf32 and bf16, 512 MiB costs
  // 1-2%; under 3xTF32, whose GEMMs split their operands in pieces of their
  // own, 512 MiB costs nothing and 1-2 GiB 8-12%.
  static const int64_t env =
      env_int("BT_HEAD_CHUNK_MIB", -1, 0, 1 << 20, "the LM head's logits per chunk in MiB (0: no chunks)");
  const int64_t mib = env >= 0 ? env : math == kernels::GemmMath::Tf32x3 ? 512 : 2048;
  if (mib == 0) return 0;
  const int64_t rows = (mib << 20) / std::max<int64_t>(vp * static_cast<int64_t>(dtype_size(dt)), 1);
  return std::max<int64_t>(64, rows / 64 * 64);
}

Tensor linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets_in, int64_t vocab,
                            float grad_hint, int64_t chunk_rows) {
  detail::check_defined("linear_cross_entropy", x, "x");
  detail::check_defined("linear_cross_entropy", w, "weight");
  detail::check_defined("linear_cross_entropy", targets_in, "targets");
  detail::check_same_device("linear_cross_entropy", x, w);
  detail::check_same_dtype("linear_cross_entropy", x, w);
  detail::check_dtype("linear_cross_entropy", x, "x", {DType::F32, DType::F64, DType::BF16});
  detail::check_dtype("linear_cross_entropy", targets_in, "targets", {DType::I32});
  detail::check_dim("linear_cross_entropy", x, "x", 2);
  detail::check_dim("linear_cross_entropy", w, "weight", 2);
  const int64_t rows = x.size(0), in = x.size(1), vp = w.size(0);
  BT_CHECK(w.size(1) == in, "linear_cross_entropy: x ", shape_str(x.shape()), " and weight ",
           shape_str(w.shape()), " [vocabulary, in] differ in their input features");
  BT_CHECK(targets_in.device() == x.device() || targets_in.device().is_cpu(),
           "linear_cross_entropy: targets must be on the device of x (", x.device(), ") or on the host, got ",
           targets_in.device());
  BT_CHECK(targets_in.numel() == rows, "linear_cross_entropy: ", targets_in.numel(), " targets (shape ",
           shape_str(targets_in.shape()), ") for ", rows, " rows of x (shape ", shape_str(x.shape()), ")");
  if (vocab < 0) vocab = vp;
  BT_CHECK(vocab > 0 && vocab <= vp, "linear_cross_entropy: vocab ", vocab, " must be in [1, ", vp,
           "] (the weight's rows)");
  const bool need_grad = autograd::any_requires_grad({&x, &w});
  if (need_grad && grad_hint == 0.0f)  // no hint: the gradient goes through the plain ops
    return cross_entropy(linear(x, w), targets_in, vocab);
  if (chunk_rows <= 0)
    chunk_rows = std::max<int64_t>(lm_head_chunk_rows(vp, x.dtype(), matmul_math(precision())), 64);

  const std::pair<Tensor, int64_t> checked =
      detail::checked_targets("linear_cross_entropy", targets_in, vocab, x.device());
  const Tensor& targets = checked.first;
  const double inv = 1.0 / static_cast<double>(std::max<int64_t>(checked.second, 1));
  const float dl = static_cast<float>(static_cast<double>(grad_hint) * inv);
  const Tensor xc = x.contiguous(), wc = w.contiguous();
  const DType dt = x.dtype();
  const DType gdt = dt == DType::BF16 ? DType::F32 : dt;  // Note [Gradients in a wider dtype]
  const TensorOptions f32{DType::F32, x.device()};
  const bool gx_wanted = need_grad && x.requires_grad(), gw_wanted = need_grad && w.requires_grad();
  Tensor loss = empty({rows}, f32), lse = empty({std::min(rows, chunk_rows)}, f32);
  Tensor logits = empty({std::min(rows, chunk_rows), vp}, x.options());
  Tensor gx = gx_wanted ? empty({rows, in}, x.options()) : Tensor();
  Tensor gw = gw_wanted ? empty({vp, in}, x.options().with_dtype(gdt)) : Tensor();
  if (gw_wanted && rows == 0) gw.zero_();
  const size_t es = dtype_size(dt);
  const auto* xp = static_cast<const unsigned char*>(xc.data_ptr());
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - r0);
    const void* x_rows = xp + r0 * in * es;
    // logits = X_rows W^T
    gemm_into(logits.data_ptr(), dt, xc, x_rows, false, in, wc.data_ptr(), true, in, n, vp, in, 0.0f);
    const kernels::CrossEntropyArgs a{dt, logits.data_ptr(), n, vocab, vp, targets.data<int32_t>() + r0};
    float* loss_rows = loss.data<float>() + r0;
    if (!need_grad) {
      detail::on_device(
          x.device(), [&] { kernels::cpu::cross_entropy_forward(a, loss_rows, lse.data<float>()); },
          BT_CUDA_LAMBDA(kernels::cuda::cross_entropy_forward(a, loss_rows, lse.data<float>(), stream)));
      continue;
    }
    // The chunk's loss, and its gradient over its logits (Note [Gradient in the forward pass]).
    detail::on_device(
        x.device(),
        [&] {
          kernels::cpu::cross_entropy_forward(a, loss_rows, lse.data<float>());
          const std::vector<float> dloss(static_cast<size_t>(n), dl);
          kernels::cpu::cross_entropy_backward(a, lse.data<float>(), dloss.data(), logits.data_ptr());
        },
        BT_CUDA_LAMBDA(kernels::cuda::cross_entropy_forward_backward(a, loss_rows, lse.data<float>(), dl,
                                                                     logits.data_ptr(), stream)));
    if (gx_wanted)  // dX rows = dlogits W
      gemm_into(static_cast<unsigned char*>(gx.data_ptr()) + r0 * in * es, dt, xc, logits.data_ptr(), false,
                vp, wc.data_ptr(), false, in, n, in, vp, 0.0f);
    if (gw_wanted)  // dW += dlogits^T X_rows
      gemm_into(gw.data_ptr(), gdt, xc, logits.data_ptr(), true, vp, x_rows, false, in, vp, in, n,
                r0 == 0 ? 0.0f : 1.0f);
  }
  logits = Tensor();
  Tensor out;
  {
    NoGradGuard ng;
    out = mul(sum(loss), inv);
  }
  if (need_grad)
    autograd::record(
        "LinearCrossEntropyBackward", {&x, &w}, out,
        [sx = SavedTensor(gx, "linear_cross_entropy"), sw = SavedTensor(gw, "linear_cross_entropy"),
         grad_hint, xs = x.shape()](autograd::Grads& g) -> autograd::Grads {
          Tensor gx = sx.unpack(), gw = sw.unpack();
          if (autograd::retaining_graph()) {  // a second pass must find them unscaled
            if (gx.defined()) gx = gx.clone();
            if (gw.defined()) gw = gw.clone();
          }
          const Tensor gin = g[0].to(DType::F32).contiguous();
          if (gx.defined()) rescale(gx, gin, grad_hint);
          if (gw.defined()) rescale(gw, gin, grad_hint);
          return {gx.defined() ? gx.view(xs) : Tensor(), gw};
        });
  return out;
}

}  // namespace bt
