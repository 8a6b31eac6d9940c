// Copies: contiguous(), clone(), dtype casts, transfers between devices, and
// the in-place writes (copy_, fill_, add_, mul_).
#include "kernels/copy.h"

#include "kernels/elementwise.h"
#include "kernels/scatter.h"
#include "runtime/autograd/function.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/compile/lazy.h"
#include "runtime/core/cuda_graph.h"
#include "runtime/ops/dispatch.h"
#include "runtime/ops/elementwise.h"
#include "runtime/tensor/factory.h"
#ifdef BT_CUDA
#include "kernels/common/cuda_check.h"
#endif

namespace bt {
namespace {

using autograd::Grads;

/// A contiguous copy of `src` with dtype `dt`, on src's device. Not recorded.
Tensor copy_as(const Tensor& src, DType dt) {
  Tensor out = empty(src.shape(), TensorOptions{dt, src.device()});
  if (src.numel() == 0) return out;
  const auto layout = detail::layout_of(src);
  detail::on_device(
      src.device(),
      [&] { kernels::cpu::strided_copy(src.dtype(), src.data_ptr(), layout, dt, out.data_ptr()); },
      BT_CUDA_LAMBDA(
          kernels::cuda::strided_copy(src.dtype(), src.data_ptr(), layout, dt, out.data_ptr(), stream)));
  return out;
}

/// Copies contiguous `src` to device `dst` (same dtype). Not recorded.
Tensor transfer(const Tensor& src, const Device& dst, bool non_blocking) {
  BT_ASSERT(src.is_contiguous());
  const bool pinned_out = non_blocking && dst.is_cpu() && src.is_cuda();
  Tensor out = empty(src.shape(), TensorOptions{src.dtype(), dst, false, pinned_out});
  const size_t bytes = src.nbytes();
  if (bytes == 0) return out;
#ifdef BT_CUDA
  if (src.device().is_cpu() && dst.is_cuda()) {
    // A captured copy reads its source again at every replay: only memory
    // that stays put (pinned, kept by the caller) can be its source.
    BT_CHECK(
        !capture_underway() || (src.is_pinned() && non_blocking), "a host-to-device copy of ", bytes,
        " bytes from ", src.is_pinned() ? "" : "pageable ", "host memory",
        src.is_pinned() ? " (blocking)" : "",
        " inside a CUDA graph capture; stage the data in pinned memory and copy it with non_blocking=true");
    DeviceGuard g(dst);
    Stream s = Stream::current(dst);
    auto cs = static_cast<cudaStream_t>(s.handle());
    BT_CUDA_CHECK(cudaMemcpyAsync(out.data_ptr(), src.data_ptr(), bytes, cudaMemcpyHostToDevice, cs));
    if (src.is_pinned()) {
      if (non_blocking)
        pinned_allocator().record_stream(src.impl()->storage->data, s);
      else
        BT_CUDA_CHECK(cudaStreamSynchronize(cs));
    }
  } else if (src.is_cuda() && dst.is_cpu()) {
    BT_CHECK(!capture_underway(),
             "a device-to-host copy inside a CUDA graph capture (the host cannot read "
             "what a capture has not run); read results after the step");
    DeviceGuard g(src.device());
    Stream s = Stream::current(src.device());
    auto cs = static_cast<cudaStream_t>(s.handle());
    BT_CUDA_CHECK(cudaMemcpyAsync(out.data_ptr(), src.data_ptr(), bytes, cudaMemcpyDeviceToHost, cs));
    if (pinned_out)
      pinned_allocator().record_stream(out.impl()->storage->data, s);
    else
      BT_CUDA_CHECK(cudaStreamSynchronize(cs));
  } else {
    DeviceGuard g(src.device());
    auto cs = static_cast<cudaStream_t>(Stream::current(src.device()).handle());
    BT_CUDA_CHECK(
        cudaMemcpyPeerAsync(out.data_ptr(), dst.index, src.data_ptr(), src.device().index, bytes, cs));
    BT_CUDA_CHECK(cudaStreamSynchronize(cs));
  }
#else
  detail::no_cuda();
#endif
  return out;
}

void check_inplace(const Tensor& t, const char* op) {
  BT_CHECK(t.defined(), op, ": the tensor is undefined");
  if (!GradMode::enabled() || !t.requires_grad()) return;
  BT_CHECK(!t.is_leaf(), op,
           ": a leaf tensor that requires grad cannot be modified in place while grad mode is on; "
           "do it inside a NoGradGuard (e.g. an optimizer step), or detach() it");
  BT_FAIL(op, ": in-place modification of a tensor that is part of the autograd graph (output of ",
          t.grad_fn()->name(), ") is not supported; use the out-of-place op");
}

/// Writes contiguous `src` (same dtype, same device, same numel) into dst's view.
void write_into(const Tensor& dst, const Tensor& src) {
  if (dst.is_contiguous()) {
    const auto layout = detail::layout_of(src);
    detail::on_device(
        dst.device(),
        [&] { kernels::cpu::strided_copy(src.dtype(), src.data_ptr(), layout, dst.dtype(), dst.data_ptr()); },
        BT_CUDA_LAMBDA(kernels::cuda::strided_copy(src.dtype(), src.data_ptr(), layout, dst.dtype(),
                                                   dst.data_ptr(), stream)));
    return;
  }
  const auto layout = detail::layout_of(dst);
  detail::on_device(
      dst.device(),
      [&] { kernels::cpu::strided_scatter(dst.dtype(), src.data_ptr(), dst.data_ptr(), layout); },
      BT_CUDA_LAMBDA(
          kernels::cuda::strided_scatter(dst.dtype(), src.data_ptr(), dst.data_ptr(), layout, stream)));
}

}  // namespace

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  Tensor y = copy_as(*this, dtype());
  if (autograd::any_requires_grad({this}))
    autograd::record("ContiguousBackward", {this}, y, [](Grads& g) -> Grads { return {g[0]}; });
  return y;
}

Tensor Tensor::clone() const {
  Tensor y = copy_as(*this, dtype());
  if (autograd::any_requires_grad({this}))
    autograd::record("CloneBackward", {this}, y, [](Grads& g) -> Grads { return {g[0]}; });
  return y;
}

Tensor Tensor::to(DType t) const {
  if (t == dtype()) return *this;
  const auto fusible = [](DType d) { return d == DType::F32 || d == DType::BF16 || d == DType::F64; };
  // Note [Lazy fusion]: a cast between float types is one more fusible op.
  Tensor y = fusible(t) && fusible(dtype()) && numel() > 0 && fusion::lazy_recording(device())
                 ? fusion::lazy_cast(*this, t)
                 : copy_as(*this, t);
  if (autograd::any_requires_grad({this})) {
    BT_CHECK(is_floating(t), "to(", t, "): a tensor that requires grad can only be cast to a floating dtype");
    // Note [Gradients in a wider dtype]: a gradient already in the source's
    // dtype (an f32 weight gradient of a bf16 GEMM) passes through uncopied.
    autograd::record("ToDTypeBackward", {this}, y, [src = dtype()](Grads& g) -> Grads {
      return {g[0].to(src)};
    }).any_grad_dtype = true;
  }
  return y;
}

Tensor Tensor::to(const Device& d, bool non_blocking) const {
  if (d == device()) return *this;
  check_device_usable(d);
  Tensor y = transfer(contiguous().detach(), d, non_blocking);
  if (autograd::any_requires_grad({this}))
    autograd::record("ToDeviceBackward", {this}, y,
                     [src = device()](Grads& g) -> Grads { return {g[0].to(src)}; });
  return y;
}

Tensor Tensor::pin_memory() const {
  BT_CHECK(device().is_cpu(), "pin_memory(): only CPU tensors can be pinned, this one is on ", device());
  if (is_pinned()) return *this;
  Tensor out = empty(shape(), TensorOptions{dtype(), Device::cpu(), false, true});
  write_into(out, contiguous().detach());
  return out;
}

Tensor& Tensor::copy_(const Tensor& src_in) {
  check_inplace(*this, "copy_");
  detail::check_defined("copy_", src_in, "src");
  Tensor src = src_in.detach();
  if (src.shape() != shape()) src = src.expand(shape());
  if (src.device() != device()) src = transfer(src.contiguous(), device(), false);
  if (src.dtype() != dtype() || !src.is_contiguous() || shares_storage(src)) src = copy_as(src, dtype());
  write_into(*this, src);
  bump_version();
  return *this;
}

Tensor& Tensor::set_data_(const Tensor& src) {
  BT_CHECK(defined() && src.defined(), "set_data_: both tensors must be defined");
  BT_CHECK(src.shape() == shape() && src.dtype() == dtype(), "set_data_: a tensor of shape ",
           shape_str(shape()), " and dtype ", dtype(), " cannot take the memory of one of shape ",
           shape_str(src.shape()), " and dtype ", src.dtype());
  impl_->storage = src.impl_->storage;
  impl_->strides = src.impl_->strides;
  impl_->offset = src.impl_->offset;
  impl_->stream = src.impl_->stream;
  return *this;
}

Tensor& Tensor::fill_(double value) {
  check_inplace(*this, "fill_");
  if (is_contiguous()) {
    detail::on_device(
        device(), [&] { kernels::cpu::fill(dtype(), data_ptr(), numel(), value); },
        BT_CUDA_LAMBDA(kernels::cuda::fill(dtype(), data_ptr(), numel(), value, stream)));
  } else {
    write_into(*this, full(shape(), value, options()));
  }
  bump_version();
  return *this;
}

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  check_inplace(*this, "add_");
  NoGradGuard ng;
  Tensor o = other.detach();
  if (o.dtype() != dtype()) o = o.to(dtype());
  if (alpha != 1.0) o = mul(o, alpha);
  if (is_contiguous() && !shares_storage(o)) {
    detail::check_same_device("add_", *this, o);
    broadcast_shapes(shape(), o.shape(), "add_");
    const auto la = detail::layout_of(*this), lb = detail::broadcast_layout(o, shape());
    detail::on_device(
        device(),
        [&] {
          kernels::cpu::binary(kernels::BinaryOp::Add, dtype(), data_ptr(), la, o.data_ptr(), lb, data_ptr());
        },
        BT_CUDA_LAMBDA(kernels::cuda::binary(kernels::BinaryOp::Add, dtype(), data_ptr(), la, o.data_ptr(),
                                             lb, data_ptr(), stream)));
    bump_version();
    return *this;
  }
  return copy_(add(detach(), o));
}

Tensor& Tensor::mul_(double factor) {
  check_inplace(*this, "mul_");
  if (is_contiguous()) {
    detail::on_device(
        device(),
        [&] {
          kernels::cpu::unary(kernels::UnaryOp::MulScalar, dtype(), data_ptr(), data_ptr(), numel(), factor);
        },
        BT_CUDA_LAMBDA(kernels::cuda::unary(kernels::UnaryOp::MulScalar, dtype(), data_ptr(), data_ptr(),
                                            numel(), factor, stream)));
    bump_version();
    return *this;
  }
  NoGradGuard ng;
  return copy_(mul(detach(), factor));
}

}  // namespace bt
