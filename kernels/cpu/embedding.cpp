// CPU embedding lookup and its backward (F32, F64, BF16; BF16 into F32). The
// backward adds rows in index order into a compute-type buffer and rounds once
// on store.
// Both run in parallel over disjoint rows (of the output, resp. of the table).
#include "kernels/embedding.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/parallel.h"

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

/// dtable (O: T, or float for bf16 dout) = the rows of d added by index; with
/// accumulate, each named row's sum (rounded to O) is added onto what dtable
/// holds, as the engine would add a zeroed table's (Note [Adding into the
/// gradient so far], runtime/autograd/engine.cpp), and the other rows are
/// left as they are.
template <class T, class O>
void backward_rows(const T* d, const int32_t* idx, int64_t n, int64_t num, int64_t dim, O* tab,
                   bool accumulate) {
  using A = acc_t<T>;
  if (dim == 0) return;
  // Chunks of table rows; each scans all n indices and adds the ones that
  // land in its rows, in index order, so every row sums as in a serial loop
  // (whatever the chunks). A chunk holds >= 8n elements, so the scans cost
  // little. An output of the compute type (F32, F64, BF16 into F32) is the
  // accumulator itself unless accumulating; otherwise sums go to a buffer of
  // the chunk's own and are rounded once on store.
  const int64_t grain = grain_for(dim, std::max<int64_t>(8 * n, int64_t{1} << 16));
  parallel_for(0, num, grain, [&](int64_t lo, int64_t hi) {
    std::vector<A> acc;
    std::vector<char> hit;
    A* base = nullptr;
    if constexpr (std::is_same_v<A, O>)
      if (!accumulate) base = tab + lo * dim;
    if (base != nullptr) {
      std::fill(base, base + (hi - lo) * dim, A(0));
    } else {
      acc.assign(static_cast<size_t>((hi - lo) * dim), A(0));
      base = acc.data();
    }
    if (accumulate) hit.assign(static_cast<size_t>(hi - lo), 0);
    for (int64_t i = 0; i < n; ++i) {
      if (idx[i] < lo || idx[i] >= hi) continue;
      A* row = base + (idx[i] - lo) * dim;
      for (int64_t j = 0; j < dim; ++j) row[j] += load(d, i * dim + j);
      if (accumulate) hit[static_cast<size_t>(idx[i] - lo)] = 1;
    }
    if (accumulate) {
      for (int64_t r = 0; r < hi - lo; ++r) {
        if (!hit[static_cast<size_t>(r)]) continue;
        for (int64_t j = 0; j < dim; ++j) {
          const int64_t e = r * dim + j, t = lo * dim + e;
          O sum;
          store(&sum, 0, acc[static_cast<size_t>(e)]);  // the row's sum as a table of O holds it
          store(tab, t, load(tab, t) + load(&sum, 0));
        }
      }
    } else if constexpr (!std::is_same_v<A, O>) {
      for (int64_t e = 0; e < (hi - lo) * dim; ++e) store(tab, lo * dim + e, acc[static_cast<size_t>(e)]);
    }
  });
}

}  // namespace

void embedding_forward(DType dt, const void* table, int64_t num, int64_t dim, const int32_t* idx, int64_t n,
                       void* out) {
  check_indices("embedding_forward", idx, n, num, dim);
  detail::dispatch_float(dt, "embedding_forward", [&]<class T>(std::type_identity<T>) {
    const T* tab = static_cast<const T*>(table);
    T* o = static_cast<T*>(out);
    if (dim == 0) return;
    parallel_for(0, n, grain_for(dim), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i)
        std::memcpy(o + i * dim, tab + idx[i] * dim, static_cast<size_t>(dim) * sizeof(T));
    });
  });
}

void embedding_backward(DType dt, const void* dout, const int32_t* idx, int64_t n, int64_t num, int64_t dim,
                        void* dtable, bool accumulate) {
  embedding_backward(dt, dt, dout, idx, n, num, dim, dtable, accumulate);
}

void embedding_backward(DType dt, DType out_dt, const void* dout, const int32_t* idx, int64_t n, int64_t num,
                        int64_t dim, void* dtable, bool accumulate) {
  check_indices("embedding_backward", idx, n, num, dim);
  if (widens(dt, out_dt, "embedding_backward")) {
    backward_rows(static_cast<const bf16*>(dout), idx, n, num, dim, static_cast<float*>(dtable), accumulate);
    return;
  }
  detail::dispatch_float(dt, "embedding_backward", [&]<class T>(std::type_identity<T>) {
    backward_rows(static_cast<const T*>(dout), idx, n, num, dim, static_cast<T*>(dtable), accumulate);
  });
}

}  // namespace bt::kernels::cpu
