// CPU embedding lookup and its backward (F32, F64, BF16). The backward adds
// rows in index order into a compute-type buffer and rounds once on store.
#include "kernels/embedding.h"

#include <cstring>
#include <vector>

#include "kernels/cpu/dispatch.h"

namespace bt::kernels::cpu {
namespace {
using detail::acc_t;
using detail::load;
using detail::store;

void check_indices(const char* kernel, const int32_t* idx, int64_t n, int64_t num, int64_t dim) {
  detail::check_count(kernel, "n", n);
  detail::check_count(kernel, "num", num);
  detail::check_count(kernel, "dim", dim);
  BT_CHECK(n == 0 || idx != nullptr, kernel, ": indices are null");
  for (int64_t i = 0; i < n; ++i)
    BT_CHECK(idx[i] >= 0 && idx[i] < num, kernel, ": index ", idx[i], " at position ", i, " is outside [0, ",
             num, ") (the embedding table has ", num, " rows)");
}

}  // namespace

void embedding_forward(DType dt, const void* table, int64_t num, int64_t dim, const int32_t* idx, int64_t n,
                       void* out) {
  check_indices("embedding_forward", idx, n, num, dim);
  detail::dispatch_float(dt, "embedding_forward", [&]<class T>(std::type_identity<T>) {
    const T* tab = static_cast<const T*>(table);
    T* o = static_cast<T*>(out);
    for (int64_t i = 0; i < n; ++i)
      if (dim > 0) std::memcpy(o + i * dim, tab + idx[i] * dim, static_cast<size_t>(dim) * sizeof(T));
  });
}

void embedding_backward(DType dt, const void* dout, const int32_t* idx, int64_t n, int64_t num, int64_t dim,
                        void* dtable) {
  check_indices("embedding_backward", idx, n, num, dim);
  detail::dispatch_float(dt, "embedding_backward", [&]<class T>(std::type_identity<T>) {
    using A = acc_t<T>;
    const T* d = static_cast<const T*>(dout);
    T* tab = static_cast<T*>(dtable);
    std::vector<A> acc(static_cast<size_t>(num * dim), A(0));
    for (int64_t i = 0; i < n; ++i) {
      A* row = acc.data() + idx[i] * dim;
      for (int64_t j = 0; j < dim; ++j) row[j] += load(d, i * dim + j);
    }
    for (int64_t e = 0; e < num * dim; ++e) store(tab, e, acc[e]);
  });
}

}  // namespace bt::kernels::cpu
