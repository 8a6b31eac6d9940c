#include "runtime/tensor/factory.h"

#include <cmath>

#include "kernels/copy.h"
#include "kernels/random.h"
#include "runtime/autograd/meta.h"
#include "runtime/ops/dispatch.h"

namespace bt {

namespace {
Tensor finish(Tensor t, const TensorOptions& opts) {
  if (opts.requires_grad) t.requires_grad_(true);
  return t;
}
}  // namespace

Tensor empty(const Shape& shape, const TensorOptions& opts) {
  for (int64_t d : shape)
    BT_CHECK(d >= 0, "cannot create a tensor with negative size in shape ", shape_str(shape));
  check_device_usable(opts.device);
  BT_CHECK(!opts.pinned || opts.device.is_cpu(),
           "pinned memory is host memory; use device cpu with pinned=true");
  auto impl = std::make_shared<TensorImpl>();
  impl->dtype = opts.dtype;
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->stream = Stream::current(opts.device);
  impl->storage =
      Storage::allocate(shape_numel(shape) * dtype_size(opts.dtype), opts.device, impl->stream, opts.pinned);
  return finish(Tensor(std::move(impl)), opts);
}

Tensor empty_like(const Tensor& t) { return empty(t.shape(), t.options()); }

Tensor full(const Shape& shape, double value, const TensorOptions& opts) {
  TensorOptions o = opts;
  o.requires_grad = false;
  Tensor t = empty(shape, o);
  t.fill_(value);
  return finish(t, opts);
}

Tensor zeros(const Shape& shape, const TensorOptions& opts) { return full(shape, 0.0, opts); }
Tensor ones(const Shape& shape, const TensorOptions& opts) { return full(shape, 1.0, opts); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.options()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.options()); }

Tensor arange(int64_t n, const TensorOptions& opts) { return arange(0.0, static_cast<double>(n), 1.0, opts); }

Tensor arange(double start, double end, double step, const TensorOptions& opts) {
  BT_CHECK(step != 0.0, "arange: step must be non-zero");
  const double count = std::ceil((end - start) / step);
  const int64_t n = count > 0 ? static_cast<int64_t>(count) : 0;
  TensorOptions o = opts;
  o.requires_grad = false;
  Tensor t = empty({n}, o);
  detail::on_device(
      t.device(), [&] { kernels::cpu::arange(t.dtype(), t.data_ptr(), n, start, step); },
      BT_CUDA_LAMBDA(kernels::cuda::arange(t.dtype(), t.data_ptr(), n, start, step, stream)));
  return finish(t, opts);
}

Generator& default_generator() {
  static Generator g(0);
  return g;
}

void manual_seed(uint64_t seed) { default_generator().set_state(seed, 0); }

namespace {
enum class Dist { Uniform, Normal };

Tensor random_fill(const Shape& shape, Dist dist, double a, double b, const TensorOptions& opts,
                   Generator* gen) {
  BT_CHECK(is_floating(opts.dtype), "random tensors must have a floating dtype, not ", opts.dtype);
  Generator& g = gen ? *gen : default_generator();
  TensorOptions o = opts;
  o.requires_grad = false;
  Tensor t = empty(shape, o);
  const int64_t n = t.numel();
  const uint64_t off = g.advance(static_cast<uint64_t>(n));
  const uint64_t seed = g.seed();
  const float fa = static_cast<float>(a), fb = static_cast<float>(b);
  detail::on_device(
      t.device(),
      [&] {
        if (dist == Dist::Uniform)
          kernels::cpu::fill_uniform(t.dtype(), t.data_ptr(), n, seed, off, fa, fb);
        else
          kernels::cpu::fill_normal(t.dtype(), t.data_ptr(), n, seed, off, fa, fb);
      },
      BT_CUDA_LAMBDA(if (dist == Dist::Uniform)
                         kernels::cuda::fill_uniform(t.dtype(), t.data_ptr(), n, seed, off, fa, fb, stream);
                     else kernels::cuda::fill_normal(t.dtype(), t.data_ptr(), n, seed, off, fa, fb, stream)));
  return finish(t, opts);
}
}  // namespace

Tensor rand(const Shape& shape, const TensorOptions& opts, Generator* gen) {
  return random_fill(shape, Dist::Uniform, 0.0, 1.0, opts, gen);
}
Tensor randn(const Shape& shape, const TensorOptions& opts, Generator* gen) {
  return random_fill(shape, Dist::Normal, 0.0, 1.0, opts, gen);
}
Tensor uniform(const Shape& shape, double lo, double hi, const TensorOptions& opts, Generator* gen) {
  BT_CHECK(lo < hi, "uniform: need lo < hi, got [", lo, ", ", hi, ")");
  return random_fill(shape, Dist::Uniform, lo, hi, opts, gen);
}
Tensor normal(const Shape& shape, double mean, double std, const TensorOptions& opts, Generator* gen) {
  BT_CHECK(std >= 0, "normal: std must be >= 0, got ", std);
  return random_fill(shape, Dist::Normal, mean, std, opts, gen);
}

template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions opts) {
  BT_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
           " values do not fill shape ", shape_str(shape), " (", shape_numel(shape), " elements)");
  Tensor host = from_blob(const_cast<T*>(values.data()), shape, dtype_of<T>());
  Tensor out = empty(shape, TensorOptions{opts.dtype, opts.device, false, opts.pinned});
  out.copy_(host);
  return finish(out, opts);
}

template Tensor from_vector(const std::vector<float>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<double>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<int32_t>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<int64_t>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<uint16_t>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<uint8_t>&, const Shape&, TensorOptions);
template Tensor from_vector(const std::vector<bf16>&, const Shape&, TensorOptions);

Tensor from_blob(void* data, const Shape& shape, DType dtype, const Device& device) {
  auto impl = std::make_shared<TensorImpl>();
  impl->dtype = dtype;
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->stream = Stream::current(device);
  auto st = std::make_shared<Storage>();
  st->data = data;
  st->nbytes = shape_numel(shape) * dtype_size(dtype);
  st->device = device;
  impl->storage = std::move(st);
  return Tensor(std::move(impl));
}

}  // namespace bt
