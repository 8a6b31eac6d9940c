#include "runtime/tensor/shape.h"

#include <algorithm>

#include "kernels/common/error.h"

namespace bt {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (int i = static_cast<int>(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int normalize_dim(int64_t dim, int ndim, const char* what) {
  // Every caller indexes a shape with the result, so a scalar has no valid dim.
  BT_CHECK(ndim > 0, what, ": dimension ", dim, " of a tensor with 0 dimensions (a scalar), which has none");
  const int64_t d = dim < 0 ? dim + ndim : dim;
  BT_CHECK(d >= 0 && d < ndim, what, ": dimension ", dim, " is out of range for a tensor with ", ndim,
           " dimension(s) (valid: ", -ndim, "..", ndim - 1, ")");
  return static_cast<int>(d);
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    BT_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
             " cannot be broadcast together (dimension ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace bt
