#include "kernels/scatter.h"

#include <cstring>

namespace bt::kernels::cpu {

void strided_scatter(DType dt, const void* src, void* dst, const StridedLayout& layout) {
  const size_t es = dtype_size(dt);
  int64_t n = 1;
  for (int d = 0; d < layout.ndim; ++d) n *= layout.shape[d];
  const char* s = static_cast<const char*>(src);
  char* o = static_cast<char*>(dst);
  for (int64_t i = 0; i < n; ++i) std::memcpy(o + layout.offset_of(i) * es, s + i * es, es);
}

namespace {
template <typename T>
void argmax_scatter_t(const T* dy, const int64_t* am, T* dx, int64_t outer, int64_t dim, int64_t inner) {
  std::memset(static_cast<void*>(dx), 0, sizeof(T) * outer * dim * inner);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t j = am[o * inner + i];
      BT_ASSERT(j >= 0 && j < dim);
      dx[(o * dim + j) * inner + i] = dy[o * inner + i];
    }
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
