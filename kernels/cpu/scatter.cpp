// CPU scatters into strided destinations (every dtype). Element ranges (rows
// for argmax_scatter) run in parallel when no two elements share a
// destination; a destination with repeated offsets is written serially, in
// element order, so the last write wins as before.
#include "kernels/scatter.h"

#include <cstring>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/parallel.h"

namespace bt::kernels::cpu {
namespace {

/// Copies element i of the contiguous src to offset_of(i) of dst for i in [lo, hi).
template <class E>
void scatter_range(const E* src, E* dst, const StridedLayout& l, int64_t lo, int64_t hi) {
  detail::for_each_strided(l, l, lo, hi, [&](int64_t i, int64_t off, int64_t) { dst[off] = src[i]; });
}

template <class E>
void scatter_as(const void* src, void* dst, const StridedLayout& l, int64_t n) {
  const E* s = static_cast<const E*>(src);
  E* o = static_cast<E*>(dst);
  if (!detail::is_non_overlapping(l)) return scatter_range(s, o, l, 0, n);
  parallel_for(0, n, int64_t{1} << 15, [&](int64_t lo, int64_t hi) { scatter_range(s, o, l, lo, hi); });
}

}  // namespace

void strided_scatter(DType dt, const void* src, void* dst, const StridedLayout& layout) {
  const int64_t n = detail::checked_numel("strided_scatter", layout);
  if (n == 0) return;
  switch (dtype_size(dt)) {
    case 1:
      return scatter_as<uint8_t>(src, dst, layout, n);
    case 2:
      return scatter_as<uint16_t>(src, dst, layout, n);
    case 4:
      return scatter_as<uint32_t>(src, dst, layout, n);
    case 8:
      return scatter_as<uint64_t>(src, dst, layout, n);
    default:
      BT_FAIL("strided_scatter: unsupported element size ", dtype_size(dt), " of dtype ", dt);
  }
}

namespace {
template <typename T>
void argmax_scatter_t(const T* dy, const int64_t* am, T* dx, int64_t outer, int64_t dim, int64_t inner) {
  // Slice o of dx ([dim, inner]) depends only on slice o of dy and argmax.
  parallel_for(0, outer, grain_for(dim * inner), [&](int64_t lo, int64_t hi) {
    std::memset(static_cast<void*>(dx + lo * dim * inner), 0, sizeof(T) * (hi - lo) * dim * inner);
    for (int64_t o = lo; o < hi; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t j = am[o * inner + i];
        BT_ASSERT(j >= 0 && j < dim);
        dx[(o * dim + j) * inner + i] = dy[o * inner + i];
      }
  });
}
}  // namespace

void argmax_scatter(DType dt, const void* dy, const int64_t* argmax, void* dx, int64_t outer, int64_t dim,
                    int64_t inner) {
  switch (dt) {
    case DType::F32:
      return argmax_scatter_t(static_cast<const float*>(dy), argmax, static_cast<float*>(dx), outer, dim,
                              inner);
    case DType::F64:
      return argmax_scatter_t(static_cast<const double*>(dy), argmax, static_cast<double*>(dx), outer, dim,
                              inner);
    case DType::BF16:
      return argmax_scatter_t(static_cast<const uint16_t*>(dy), argmax, static_cast<uint16_t*>(dx), outer,
                              dim, inner);
    default:
      BT_FAIL("argmax_scatter: unsupported dtype ", dt);
  }
}

}  // namespace bt::kernels::cpu
