// A strided view of a test buffer, written as plain vectors, for the kernel
// tests that gather from one (strided_copy) or scatter into one
// (strided_scatter), on the CPU and on the GPU.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/common/layout.h"

namespace bt::test {

struct StridedView {
  std::vector<int64_t> shape, strides;
  int64_t offset = 0;  // element offset of the view's origin in the buffer

  kernels::StridedLayout layout() const {
    kernels::StridedLayout l;
    l.ndim = static_cast<int>(shape.size());
    for (int d = 0; d < l.ndim; ++d) l.shape[d] = shape[d], l.strides[d] = strides[d];
    return l;
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
  /// Elements the buffer needs so every offset of the view is in range
  /// (negative strides walk back from `offset`, which must leave room).
  int64_t extent() const {
    int64_t hi = offset;
    for (size_t d = 0; d < shape.size(); ++d)
      if (shape[d] > 0 && strides[d] > 0) hi += (shape[d] - 1) * strides[d];
    return hi + 1;
  }
};

}  // namespace bt::test
