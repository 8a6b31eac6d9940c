// bt::Tensor: a cheap, shared handle to a TensorImpl. Copying a Tensor copies
// the handle; views (reshape, permute, slice, ...) share storage. Math lives
// in free functions (runtime/ops/*.h); this header holds the handle, views,
// conversions and autograd accessors.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "runtime/tensor/tensor_impl.h"

namespace bt {

class Node;

/// How to create a tensor: element type, device, whether autograd tracks it,
/// and (CPU only) whether to use page-locked memory.
struct TensorOptions {
  DType dtype = DType::F32;
  Device device = Device::cpu();
  bool requires_grad = false;
  bool pinned = false;

  TensorOptions& with_dtype(DType d) {
    dtype = d;
    return *this;
  }
  TensorOptions& with_device(Device d) {
    device = d;
    return *this;
  }
  TensorOptions& with_requires_grad(bool r = true) {
    requires_grad = r;
    return *this;
  }
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  // ---- metadata
  DType dtype() const { return impl_->dtype; }
  const Shape& shape() const { return impl_->shape; }
  const Shape& strides() const { return impl_->strides; }
  int64_t offset() const { return impl_->offset; }
  int dim() const { return static_cast<int>(impl_->shape.size()); }
  int64_t size(int64_t d) const;
  int64_t numel() const { return shape_numel(impl_->shape); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  Device device() const { return impl_->storage->device; }
  Stream stream() const { return impl_->stream; }
  bool is_cuda() const { return device().is_cuda(); }
  bool is_contiguous() const;
  bool is_pinned() const { return impl_->storage->pinned; }
  bool shares_storage(const Tensor& o) const { return impl_->storage == o.impl_->storage; }
  /// Address of element 0 of this view.
  void* data_ptr() const;
  /// Typed pointer; throws bt::Error if T does not match dtype().
  template <typename T>
  T* data() const;
  TensorOptions options() const { return TensorOptions{dtype(), device(), false, false}; }

  // ---- views (share storage; differentiable)
  Tensor view(const Shape& shape) const;     // requires compatible strides
  Tensor reshape(const Shape& shape) const;  // view if possible, else copy
  Tensor flatten(int64_t start = 0, int64_t end = -1) const;
  Tensor permute(const std::vector<int>& dims) const;
  Tensor transpose(int64_t a, int64_t b) const;
  Tensor t() const { return transpose(-2, -1); }
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor expand(const Shape& shape) const;
  /// This tensor if already contiguous, else a contiguous copy.
  Tensor contiguous() const;

  // ---- conversions and copies (differentiable)
  Tensor to(const Device& d, bool non_blocking = false) const;
  Tensor to(DType t) const;
  Tensor clone() const;
  Tensor cpu() const { return to(Device::cpu()); }
  /// A pinned-host copy (for asynchronous host-to-device copies).
  Tensor pin_memory() const;
  /// A tensor sharing storage but cut out of the autograd graph.
  Tensor detach() const;

  // ---- in-place (bump the version counter; not differentiable)
  Tensor& copy_(const Tensor& src);  // broadcasts src, converts dtype, crosses devices
  /// Points this tensor -- every handle to it, autograd's included -- at
  /// `src`'s memory (same shape and dtype; values are not copied). Not an
  /// autograd op: how distributed strategies move parameters into flat buffers.
  Tensor& set_data_(const Tensor& src);
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& mul_(double factor);
  uint64_t version() const { return impl_->storage->version.load(); }
  void bump_version() const {
    impl_->storage->version.fetch_add(1);
    if (impl_->storage->recompute) impl_->storage->recompute->written = true;
  }

  // ---- values
  template <typename T>
  T item() const;
  template <typename T>
  std::vector<T> to_vector() const;
  std::string str(int max_per_dim = 6) const;

  // ---- autograd (runtime/autograd)
  bool requires_grad() const;
  Tensor& requires_grad_(bool on = true);
  bool is_leaf() const;
  Tensor grad() const;
  /// Sets .grad (e.g. a view of a flat gradient buffer; accumulation then writes into it).
  void set_grad(const Tensor& g) const;
  /// Zeroes .grad in place if it exists (keeps flat-buffer views valid).
  void zero_grad() const;
  std::shared_ptr<Node> grad_fn() const;
  /// Runs reverse-mode autodiff from this tensor. `gradient` defaults to 1 for scalars.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  /// Hook called once per backward pass on a leaf, after its gradient for that
  /// pass is fully accumulated into .grad. DDP/ZeRO start communication here.
  void register_grad_ready_hook(std::function<void(const Tensor&)> hook) const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::F64;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::BF16;
}
template <>
constexpr DType dtype_of<f16>() {
  return DType::F16;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::I32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::I64;
}
template <>
constexpr DType dtype_of<uint16_t>() {
  return DType::U16;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::U8;
}
template <>
constexpr DType dtype_of<bool>() {
  return DType::Bool;
}

template <typename T>
T* Tensor::data() const {
  BT_CHECK(dtype_of<T>() == dtype(), "tensor has dtype ", dtype(), " but was accessed as ", dtype_of<T>());
  return static_cast<T*>(data_ptr());
}

}  // namespace bt
