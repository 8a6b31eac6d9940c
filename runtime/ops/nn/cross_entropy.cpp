#include "runtime/ops/nn/cross_entropy.h"

#include "kernels/cross_entropy.h"
#include "runtime/autograd/engine.h"
#include "runtime/autograd/function.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/ops/dispatch.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/reduce.h"
#include "runtime/tensor/factory.h"

namespace bt {

namespace detail {

std::pair<Tensor, int64_t> checked_targets(const char* op, const Tensor& targets, int64_t vocab,
                                           const Device& device) {
  // Note [Targets on the host]: checked where they are; device targets are
  // copied back, which waits for the work that made them.
  Tensor t = targets.reshape({-1}).contiguous();
  const std::vector<int32_t> v = t.to_vector<int32_t>();
  int64_t valid = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    BT_CHECK(v[i] == -1 || (v[i] >= 0 && v[i] < vocab), op, ": target ", v[i], " at position ", i,
             " is outside [0, ", vocab, "); use -1 to ignore a position");
    valid += v[i] != -1;
  }
  return {t.to(device, /*non_blocking=*/true), valid};
}

}  // namespace detail

// Note [Gradient in the forward pass]
// The logits are the largest tensor of a GPT step (rows x padded vocabulary)
// and cross-entropy is their only reader: its forward reads them once for the
// log-sum-exp, its backward once more to write the gradient. When the caller
// hands the logits over (moved in: the op holds the only handle) and says
// which incoming gradient to expect (`grad_hint`: the Trainer backpropagates
// exactly that value, 1 / grad_accum), the forward writes the gradient over
// the logits as soon as each row's log-sum-exp is known, in the same pass
// (cuda::cross_entropy_forward_backward: the bits of the two kernels). The
// backward then has nothing to read: it returns that buffer, after a kernel
// that compares the incoming gradient with the hint on the device (no host
// read, so a CUDA graph captures it) and rescales only when they differ.
// With retain_graph the rescale goes to a copy, so a second pass sees the
// buffer unchanged. The saved bandwidth: one read of the logits per step.
Tensor cross_entropy(Tensor logits_in, const Tensor& targets_in, int64_t vocab, float grad_hint) {
  const bool consumed = logits_in.defined() && logits_in.impl_ptr()->storage.use_count() == 1;
  detail::check_defined("cross_entropy", logits_in, "logits");
  detail::check_defined("cross_entropy", targets_in, "targets");
  detail::check_dtype("cross_entropy", logits_in, "logits", {DType::F32, DType::F64, DType::BF16});
  detail::check_dtype("cross_entropy", targets_in, "targets", {DType::I32});
  // Note [Targets on the host]: the targets are checked on the host, so targets
  // that live there (the loader's pinned batches) cost no device sync; the
  // kernels get an asynchronous copy. Device targets are copied back to check
  // them, which waits for the work that made them.
  BT_CHECK(targets_in.device() == logits_in.device() || targets_in.device().is_cpu(),
           "cross_entropy: targets must be on the logits' device (", logits_in.device(),
           ") or on the host, got ", targets_in.device());
  BT_CHECK(logits_in.dim() >= 1, "cross_entropy: logits need a vocabulary dimension");
  const int64_t ld = logits_in.size(-1);
  const int64_t rows = ld ? logits_in.numel() / ld : 0;
  if (vocab < 0) vocab = ld;
  BT_CHECK(vocab > 0 && vocab <= ld, "cross_entropy: vocab ", vocab, " must be in [1, ", ld,
           "] (logits' last dim)");
  BT_CHECK(targets_in.numel() == rows, "cross_entropy: ", targets_in.numel(), " targets (shape ",
           shape_str(targets_in.shape()), ") for ", rows, " rows of logits (shape ",
           shape_str(logits_in.shape()), ")");
  Tensor logits = logits_in.reshape({rows, ld}).contiguous();
  std::pair<Tensor, int64_t> checked =
      detail::checked_targets("cross_entropy", targets_in, vocab, logits.device());
  const Tensor targets = std::move(checked.first);
  const int64_t valid = checked.second;

  kernels::CrossEntropyArgs a{logits.dtype(), logits.data_ptr(), rows, vocab, ld, targets.data<int32_t>()};
  TensorOptions f32{DType::F32, logits.device()};
  Tensor loss = empty({rows}, f32), lse = empty({rows}, f32);
  const double inv = 1.0 / static_cast<double>(std::max<int64_t>(valid, 1));
  const bool fuse = grad_hint != 0.0f && consumed && autograd::any_requires_grad({&logits_in}) &&
                    logits.impl_ptr()->storage == logits_in.impl_ptr()->storage;
  if (fuse) {  // Note [Gradient in the forward pass]
    const float dl = static_cast<float>(static_cast<double>(grad_hint) * inv);
    detail::on_device(
        logits.device(),
        [&] {
          kernels::cpu::cross_entropy_forward(a, loss.data<float>(), lse.data<float>());
          const std::vector<float> dloss(static_cast<size_t>(rows), dl);
          kernels::cpu::cross_entropy_backward(a, lse.data<float>(), dloss.data(), logits.data_ptr());
        },
        BT_CUDA_LAMBDA(kernels::cuda::cross_entropy_forward_backward(a, loss.data<float>(), lse.data<float>(),
                                                                     dl, logits.data_ptr(), stream)));
    logits.bump_version();  // the storage holds the gradient now
    Tensor out;
    {
      NoGradGuard ng;
      out = mul(sum(loss), inv);
    }
    autograd::record("CrossEntropyBackward", {&logits_in, nullptr}, out,
                     [sg = SavedTensor(logits, "cross_entropy"), grad_hint,
                      shape = logits_in.shape()](autograd::Grads& g) -> autograd::Grads {
                       Tensor d = sg.unpack();
                       if (autograd::retaining_graph()) d = d.clone();
                       const Tensor gin = g[0].to(DType::F32).contiguous();
                       detail::on_device(
                           d.device(),
                           [&] {
                             const float gv = gin.item<float>();
                             if (gv != grad_hint) d.mul_(static_cast<double>(gv / grad_hint));
                           },
                           BT_CUDA_LAMBDA(kernels::cuda::cross_entropy_rescale(
                               d.dtype(), d.data_ptr(), d.numel(), gin.data<float>(), grad_hint, stream)));
                       d.bump_version();
                       return {d.view(shape), Tensor()};
                     });
    return out;
  }
  detail::on_device(
      logits.device(), [&] { kernels::cpu::cross_entropy_forward(a, loss.data<float>(), lse.data<float>()); },
      BT_CUDA_LAMBDA(kernels::cuda::cross_entropy_forward(a, loss.data<float>(), lse.data<float>(), stream)));
  Tensor out;
  {
    NoGradGuard ng;
    out = mul(sum(loss), inv);
  }
  if (autograd::any_requires_grad({&logits_in}))
    autograd::record("CrossEntropyBackward", {&logits_in, nullptr}, out,
                     [sl = SavedTensor(logits, "cross_entropy"), st = SavedTensor(targets, "cross_entropy"),
                      slse = SavedTensor(lse, "cross_entropy"), inv, rows, vocab, ld,
                      shape = logits_in.shape()](autograd::Grads& g) -> autograd::Grads {
                       Tensor logits = sl.unpack(), targets = st.unpack(), lse = slse.unpack();
                       // d(mean)/d(loss_row) = g / valid for every row (ignored rows get 0 in the kernel).
                       Tensor dloss = mul(g[0].to(DType::F32), inv).reshape({1}).expand({rows}).contiguous();
                       // Note [Gradient over the logits]: the logits are the largest
                       // activation (rows x padded vocabulary); when this node's
                       // saved copy is the only handle left on their storage and
                       // the graph is freed after this pass, the gradient
                       // overwrites them instead of taking a second buffer as large.
                       const bool reuse =
                           !autograd::retaining_graph() && logits.impl_ptr()->storage.use_count() == 1;
                       Tensor dlogits = reuse ? logits : empty(logits.shape(), logits.options());
                       if (reuse) logits.bump_version();
                       kernels::CrossEntropyArgs a{logits.dtype(),         logits.data_ptr(), rows, vocab, ld,
                                                   targets.data<int32_t>()};
                       detail::on_device(
                           logits.device(),
                           [&] {
                             kernels::cpu::cross_entropy_backward(a, lse.data<float>(), dloss.data<float>(),
                                                                  dlogits.data_ptr());
                           },
                           BT_CUDA_LAMBDA(kernels::cuda::cross_entropy_backward(
                               a, lse.data<float>(), dloss.data<float>(), dlogits.data_ptr(), stream)));
                       return {dlogits.view(shape), Tensor()};
                     });
  return out;
}

}  // namespace bt
