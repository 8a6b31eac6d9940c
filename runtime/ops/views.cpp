// View ops: new shapes and strides over the same storage, differentiable.
#include <algorithm>
#include <numeric>

#include "runtime/autograd/function.h"
#include "runtime/ops/elementwise.h"
#include "runtime/tensor/factory.h"

namespace bt {
namespace {

using autograd::Grads;

Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.impl()->storage;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  impl->stream = base.stream();
  return Tensor(std::move(impl));
}

/// Resolves one -1 in `shape` against `numel`.
Shape infer_shape(Shape shape, int64_t numel, const Shape& from) {
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < static_cast<int>(shape.size()); ++i) {
    if (shape[i] == -1) {
      BT_CHECK(infer < 0, "reshape: only one dimension can be -1, got ", shape_str(shape));
      infer = i;
    } else {
      BT_CHECK(shape[i] >= 0, "reshape: invalid size ", shape[i], " in ", shape_str(shape));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    BT_CHECK(known > 0 && numel % known == 0, "reshape: cannot reshape ", shape_str(from), " (", numel,
             " elements) into ", shape_str(shape));
    shape[infer] = numel / known;
  }
  BT_CHECK(shape_numel(shape) == numel, "reshape: cannot reshape ", shape_str(from), " (", numel,
           " elements) into ", shape_str(shape), " (", shape_numel(shape), " elements)");
  return shape;
}

/// Strides for viewing a tensor of (old shape, old strides) as `shape` without
/// a copy, if possible. Walks both shapes from the innermost dim, matching
/// chunks of equal element count; each chunk of old dims must be contiguous
/// within itself (the same rule PyTorch's view uses).
bool view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& shape, Shape& out) {
  out.assign(shape.size(), 0);
  if (shape_numel(shape) == 0 || old_shape.empty()) {
    out = contiguous_strides(shape);
    return true;
  }
  int view_d = static_cast<int>(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int d = static_cast<int>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    const bool chunk_ends =
        d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
      out[view_d] = view_numel * chunk_base_stride;
      view_numel *= shape[view_d];
      --view_d;
    }
    if (view_numel != tensor_numel) return false;
    if (d > 0) {
      chunk_base_stride = old_strides[d - 1];
      tensor_numel = 1;
      view_numel = 1;
    }
  }
  return view_d == -1;
}

void record_reshape(const Tensor& x, const Tensor& y, const char* name) {
  if (autograd::any_requires_grad({&x}))
    autograd::record(name, {&x}, y, [xs = x.shape()](Grads& g) -> Grads { return {g[0].reshape(xs)}; });
}

}  // namespace

Tensor Tensor::view(const Shape& shape_in) const {
  const Shape shape = infer_shape(shape_in, numel(), this->shape());
  Shape st;
  BT_CHECK(view_strides(this->shape(), strides(), shape, st), "view: a tensor of shape ",
           shape_str(this->shape()), " with strides ", shape_str(strides()), " cannot be viewed as ",
           shape_str(shape), " without a copy; use reshape() (copies when needed) or contiguous() first");
  Tensor y = make_view(*this, shape, st, offset());
  record_reshape(*this, y, "ViewBackward");
  return y;
}

Tensor Tensor::reshape(const Shape& shape_in) const {
  const Shape shape = infer_shape(shape_in, numel(), this->shape());
  Shape st;
  if (view_strides(this->shape(), strides(), shape, st)) {
    Tensor y = make_view(*this, shape, st, offset());
    record_reshape(*this, y, "ReshapeBackward");
    return y;
  }
  return contiguous().view(shape);
}

Tensor Tensor::flatten(int64_t start, int64_t end) const {
  if (dim() == 0) return reshape({1});
  const int s = normalize_dim(start, dim(), "flatten"), e = normalize_dim(end, dim(), "flatten");
  BT_CHECK(s <= e, "flatten: start dim ", start, " is after end dim ", end);
  Shape out(shape().begin(), shape().begin() + s);
  int64_t m = 1;
  for (int i = s; i <= e; ++i) m *= shape()[i];
  out.push_back(m);
  out.insert(out.end(), shape().begin() + e + 1, shape().end());
  return reshape(out);
}

Tensor Tensor::permute(const std::vector<int>& dims) const {
  BT_CHECK(static_cast<int>(dims.size()) == dim(), "permute: got ", dims.size(), " dims for a tensor with ",
           dim());
  Shape sh(dim()), st(dim());
  std::vector<int> inv(dim(), -1);
  for (int i = 0; i < dim(); ++i) {
    const int d = normalize_dim(dims[i], dim(), "permute");
    BT_CHECK(inv[d] < 0, "permute: dimension ", d, " appears twice");
    inv[d] = i;
    sh[i] = shape()[d];
    st[i] = strides()[d];
  }
  Tensor y = make_view(*this, sh, st, offset());
  if (autograd::any_requires_grad({this}))
    autograd::record("PermuteBackward", {this}, y, [inv](Grads& g) -> Grads { return {g[0].permute(inv)}; });
  return y;
}

Tensor Tensor::transpose(int64_t a, int64_t b) const {
  std::vector<int> p(dim());
  std::iota(p.begin(), p.end(), 0);
  std::swap(p[normalize_dim(a, dim(), "transpose")], p[normalize_dim(b, dim(), "transpose")]);
  return permute(p);
}

Tensor Tensor::slice(int64_t dim_in, int64_t start, int64_t end, int64_t step) const {
  const int d = normalize_dim(dim_in, dim(), "slice");
  BT_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t n = shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape sh = shape(), st = strides();
  sh[d] = (end - start + step - 1) / step;
  st[d] = strides()[d] * step;
  Tensor y = make_view(*this, sh, st, offset() + start * strides()[d]);
  if (autograd::any_requires_grad({this}))
    autograd::record("SliceBackward", {this}, y, [xs = shape(), d, start, end, step](Grads& g) -> Grads {
      Tensor gi = zeros(xs, g[0].options());
      gi.slice(d, start, end, step).copy_(g[0]);
      return {gi};
    });
  return y;
}

Tensor Tensor::narrow(int64_t dim_in, int64_t start, int64_t length) const {
  const int d = normalize_dim(dim_in, dim(), "narrow");
  BT_CHECK(start >= 0 && length >= 0 && start + length <= shape()[d], "narrow: range [", start, ", ",
           start + length, ") is out of bounds for dimension ", d, " of size ", shape()[d]);
  return slice(d, start, start + length);
}

Tensor Tensor::select(int64_t dim_in, int64_t index) const {
  const int d = normalize_dim(dim_in, dim(), "select");
  const int64_t n = shape()[d];
  BT_CHECK(index >= -n && index < n, "select: index ", index, " is out of range for dimension ", d,
           " of size ", n);
  if (index < 0) index += n;
  return slice(d, index, index + 1).squeeze(d);
}

Tensor Tensor::unsqueeze(int64_t dim_in) const {
  const int d = normalize_dim(dim_in, dim() + 1, "unsqueeze");
  Shape sh = shape();
  sh.insert(sh.begin() + d, 1);
  return reshape(sh);
}

Tensor Tensor::squeeze(int64_t dim_in) const {
  const int d = normalize_dim(dim_in, dim(), "squeeze");
  if (shape()[d] != 1) return *this;
  Shape sh = shape();
  sh.erase(sh.begin() + d);
  return reshape(sh);
}

Tensor Tensor::expand(const Shape& target) const {
  BT_CHECK(target.size() >= shape().size(), "expand: cannot expand shape ", shape_str(shape()),
           " to fewer dims ", shape_str(target));
  const size_t lead = target.size() - shape().size();
  Shape sh(target.size()), st(target.size());
  for (size_t i = 0; i < target.size(); ++i) {
    const int64_t want = target[i];
    if (i < lead) {
      BT_CHECK(want >= 0, "expand: new leading dims must be sizes, got ", shape_str(target));
      sh[i] = want;
      st[i] = 0;
      continue;
    }
    const int64_t have = shape()[i - lead];
    const int64_t w = want == -1 ? have : want;
    BT_CHECK(have == w || have == 1, "expand: cannot expand shape ", shape_str(shape()), " to ",
             shape_str(target), " (dimension ", i, ": ", have, " -> ", w, ")");
    sh[i] = w;
    st[i] = have == w ? strides()[i - lead] : 0;
  }
  Tensor y = make_view(*this, sh, st, offset());
  if (autograd::any_requires_grad({this}))
    autograd::record("ExpandBackward", {this}, y,
                     [xs = shape()](Grads& g) -> Grads { return {sum_to(g[0], xs)}; });
  return y;
}

}  // namespace bt
