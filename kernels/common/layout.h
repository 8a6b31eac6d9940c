// Strided views of raw buffers, shared by the CPU and CUDA kernels.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define BT_HD __host__ __device__
#else
#define BT_HD
#endif

namespace bt::kernels {

inline constexpr int kMaxDims = 8;

/// Shape and element strides of an n-d view (ndim <= kMaxDims). A broadcast
/// dimension has stride 0. Offsets are applied by the caller to the base pointer.
struct StridedLayout {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  /// Element offset of the i-th element in row-major order of `shape`.
  BT_HD int64_t offset_of(int64_t linear) const {
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t idx = linear % shape[d];
      linear /= shape[d];
      off += idx * strides[d];
    }
    return off;
  }
};

}  // namespace bt::kernels
