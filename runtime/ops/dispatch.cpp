#include "runtime/ops/dispatch.h"

namespace bt::detail {

void no_cuda() {
  BT_FAIL(
      "this BluTrain was built without CUDA, so CUDA tensors cannot be used; use device cpu or rebuild on a "
      "machine with nvcc");
}

kernels::StridedLayout layout_of(const Tensor& t) { return broadcast_layout(t, t.shape()); }

kernels::StridedLayout broadcast_layout(const Tensor& t, const Shape& shape) {
  BT_CHECK(static_cast<int>(shape.size()) <= kernels::kMaxDims, "tensors have at most ", kernels::kMaxDims,
           " dimensions, got ", shape.size());
  kernels::StridedLayout l;
  l.ndim = static_cast<int>(shape.size());
  const int lead = l.ndim - t.dim();
  BT_ASSERT(lead >= 0);
  for (int i = 0; i < l.ndim; ++i) {
    l.shape[i] = shape[i];
    if (i < lead) {
      l.strides[i] = 0;
    } else {
      const int64_t ts = t.shape()[i - lead];
      BT_ASSERT(ts == shape[i] || ts == 1);
      l.strides[i] = ts == shape[i] ? t.strides()[i - lead] : 0;
    }
  }
  return l;
}

void check_defined(const char* op, const Tensor& t, const char* arg) {
  BT_CHECK(t.defined(), op, ": argument '", arg, "' is an undefined tensor");
}

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  BT_CHECK(a.device() == b.device(), op, ": expected all tensors on one device, got ", a.device(), " and ",
           b.device(), "; move them with .to(device)");
}

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  BT_CHECK(a.dtype() == b.dtype(), op, ": dtype mismatch, ", a.dtype(), " vs ", b.dtype(),
           "; convert one with .to(dtype)");
}

void check_dtype(const char* op, const Tensor& t, const char* arg, std::initializer_list<DType> allowed) {
  for (DType d : allowed)
    if (t.dtype() == d) return;
  std::string names;
  for (DType d : allowed) names += (names.empty() ? "" : ", ") + std::string(dtype_name(d));
  BT_FAIL(op, ": argument '", arg, "' has dtype ", t.dtype(), " but must be one of ", names);
}

void check_dim(const char* op, const Tensor& t, const char* arg, int ndim) {
  BT_CHECK(t.dim() == ndim, op, ": argument '", arg, "' must have ", ndim, " dimension(s), got shape ",
           shape_str(t.shape()));
}

}  // namespace bt::detail
