// Tensor metadata, element access and printing.
#include "runtime/tensor/tensor.h"

#include <cmath>
#include <iomanip>
#include <sstream>

#include "runtime/autograd/meta.h"

namespace bt {

TensorImpl::TensorImpl() = default;
TensorImpl::~TensorImpl() = default;

int64_t Tensor::size(int64_t d) const { return shape()[normalize_dim(d, dim(), "size")]; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int i = dim() - 1; i >= 0; --i) {
    if (shape()[i] == 1) continue;
    if (strides()[i] != expected) return false;
    expected *= shape()[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  const Storage& st = *impl_->storage;
  if (st.pending || st.lazy_readers.load(std::memory_order_relaxed) > 0) {
    // Note [Lazy fusion]: compute what is pending before this data is read or written.
    if (const PendingFlush flush = g_pending_flush.load()) flush();
  }
  BT_CHECK(impl_->storage->resident(),
           "this tensor's memory was released (Note [Released storage]): a ZeRO-3 parameter read outside "
           "its unit's forward/backward; gather the parameters first (Strategy::gather_parameters)");
  return static_cast<char*>(impl_->storage->data) + impl_->offset * static_cast<int64_t>(dtype_size(dtype()));
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->shape = impl_->shape;
  impl->strides = impl_->strides;
  impl->offset = impl_->offset;
  impl->dtype = impl_->dtype;
  impl->stream = impl_->stream;
  return Tensor(std::move(impl));
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = detach().to(Device::cpu()).to(dtype_of<T>()).contiguous();
  const T* p = static_cast<const T*>(host.data_ptr());
  return std::vector<T>(p, p + host.numel());
}

template <typename T>
T Tensor::item() const {
  BT_CHECK(numel() == 1, "item(): the tensor has ", numel(), " elements (shape ", shape_str(shape()),
           "); item() needs exactly one");
  return to_vector<T>()[0];
}

template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<uint16_t> Tensor::to_vector<uint16_t>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template int32_t Tensor::item<int32_t>() const;
template int64_t Tensor::item<int64_t>() const;

namespace {
void print_rec(std::ostream& os, const std::vector<double>& v, const Shape& shape, int d, int64_t base,
               int64_t stride_total, int max_per_dim, bool integral) {
  const int64_t n = shape[d];
  const int64_t inner = stride_total / std::max<int64_t>(n, 1);
  os << "[";
  for (int64_t i = 0; i < n; ++i) {
    if (n > 2 * max_per_dim && i == max_per_dim) {
      os << "..., ";
      i = n - max_per_dim;
    }
    if (d + 1 == static_cast<int>(shape.size())) {
      const double x = v[base + i];
      if (integral)
        os << static_cast<int64_t>(x);
      else
        os << std::setprecision(4) << x;
    } else {
      print_rec(os, v, shape, d + 1, base + i * inner, inner, max_per_dim, integral);
    }
    if (i + 1 < n) os << (d + 1 == static_cast<int>(shape.size()) ? ", " : ",\n" + std::string(d + 8, ' '));
  }
  os << "]";
}
}  // namespace

std::string Tensor::str(int max_per_dim) const {
  if (!defined()) return "tensor(undefined)";
  std::ostringstream os;
  os << "tensor(";
  const std::vector<double> v = to_vector<double>();
  const bool integral = !is_floating(dtype());
  if (dim() == 0)
    os << (integral ? std::to_string(static_cast<int64_t>(v[0])) : (std::ostringstream() << v[0]).str());
  else
    print_rec(os, v, shape(), 0, 0, numel(), max_per_dim, integral);
  os << ", shape=" << shape_str(shape()) << ", dtype=" << dtype() << ", device=" << device();
  if (requires_grad()) os << (is_leaf() ? ", requires_grad" : ", grad_fn=" + grad_fn()->name());
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace bt
