// CPU reductions over the middle dimension of [outer, dim, inner]. Outputs
// (rows, or blocks of inner) run in parallel; each sums in the serial order.
#include "kernels/reduce.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/parallel.h"

namespace bt::kernels::cpu {
namespace {
using detail::acc_t;
using detail::load;
using detail::store;

/// Sum of x[0..n) in A with 8 interleaved partial sums (vectorizable, and
/// more accurate than one chain).
template <class T, class A = acc_t<T>>
A sum_chunk(const T* x, int64_t n) {
  A part[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) part[l] += load(x, i + l);
  A s = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  for (; i < n; ++i) s += load(x, i);
  return s;
}

/// Sum of x[0..n): chunks of 4096 summed as above, chunk sums added in double,
/// so the error stays near that of 512-term chains however long the row is (a
/// gradient norm over millions of elements must not drift with the buffer's
/// layout: ZeRO sums shards, one process whole tensors).
template <class T, class A = acc_t<T>>
A sum_row(const T* x, int64_t n) {
  constexpr int64_t kChunk = 4096;
  if (n <= kChunk) return sum_chunk(x, n);
  double total = 0;
  for (int64_t i = 0; i < n; i += kChunk)
    total += static_cast<double>(sum_chunk(x + i, std::min(kChunk, n - i)));
  return static_cast<A>(total);
}

/// max with NaN winning; ties keep the earlier index.
template <class A>
inline bool better(A v, A best) {
  return v > best || (v != v && best == best);
}

/// O: the output's storage type, T's or (BF16 input) float.
template <class T, class O>
void reduce_impl(ReduceOp op, const T* in, O* out, int64_t outer, int64_t dim, int64_t inner,
                 int64_t* argmax) {
  using A = acc_t<T>;
  if (inner == 1) {  // rows in parallel
    parallel_for(0, outer, grain_for(dim), [&](int64_t lo, int64_t hi) {
      for (int64_t o = lo; o < hi; ++o) {
        const T* row = in + o * dim;
        if (op == ReduceOp::Max) {
          A best = load(row, 0);
          int64_t bi = 0;
          for (int64_t d = 1; d < dim; ++d) {
            const A v = load(row, d);
            if (better(v, best)) best = v, bi = d;
          }
          store(out, o, best);
          if (argmax) argmax[o] = bi;
        } else {
          A s = sum_row(row, dim);
          if (op == ReduceOp::Mean) s /= static_cast<A>(dim);
          store(out, o, s);
        }
      }
    });
    return;
  }
  // inner > 1: walk the dim rows in order, accumulating a vector of (a block
  // of) `inner`; the (outer, inner block) tasks run in parallel.
  constexpr int64_t kBlock = 256;
  const int64_t nblocks = (inner + kBlock - 1) / kBlock;
  parallel_for(0, outer * nblocks, grain_for(dim * std::min(inner, kBlock)), [&](int64_t lo, int64_t hi) {
    std::vector<A> acc(static_cast<size_t>(kBlock));
    std::vector<int64_t> idx(op == ReduceOp::Max ? static_cast<size_t>(kBlock) : 0);
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t o = task / nblocks, i0 = task % nblocks * kBlock, m = std::min(kBlock, inner - i0);
      const T* base = in + o * dim * inner + i0;
      for (int64_t i = 0; i < m; ++i) acc[i] = op == ReduceOp::Max ? load(base, i) : A(0);
      if (op == ReduceOp::Max) {
        std::fill(idx.begin(), idx.end(), 0);
        for (int64_t d = 1; d < dim; ++d)
          for (int64_t i = 0; i < m; ++i) {
            const A v = load(base, d * inner + i);
            if (better(v, acc[i])) acc[i] = v, idx[i] = d;
          }
      } else {
        for (int64_t d = 0; d < dim; ++d)
          for (int64_t i = 0; i < m; ++i) acc[i] += load(base, d * inner + i);
        if (op == ReduceOp::Mean)
          for (int64_t i = 0; i < m; ++i) acc[i] /= static_cast<A>(dim);
      }
      for (int64_t i = 0; i < m; ++i) store(out, o * inner + i0 + i, acc[i]);
      if (argmax && op == ReduceOp::Max)
        for (int64_t i = 0; i < m; ++i) argmax[o * inner + i0 + i] = idx[i];
    }
  });
}

void reduce_any(ReduceOp op, DType dt, DType out_dt, const void* in, void* out, int64_t outer, int64_t dim,
                int64_t inner, int64_t* argmax) {
  detail::check_count("reduce_dim", "outer", outer);
  detail::check_count("reduce_dim", "dim", dim);
  detail::check_count("reduce_dim", "inner", inner);
  BT_CHECK(op == ReduceOp::Sum || op == ReduceOp::Mean || op == ReduceOp::Max, "reduce_dim: unknown op ",
           static_cast<int>(op));
  BT_CHECK(op != ReduceOp::Max || dim > 0 || outer * inner == 0,
           "reduce_dim: max over an empty dimension is undefined");
  if (reduce_widens(op, dt, out_dt, "reduce_dim")) {
    reduce_impl(op, static_cast<const bf16*>(in), static_cast<float*>(out), outer, dim, inner, nullptr);
    return;
  }
  detail::dispatch_float(dt, "reduce_dim", [&]<class T>(std::type_identity<T>) {
    reduce_impl(op, static_cast<const T*>(in), static_cast<T*>(out), outer, dim, inner, argmax);
  });
}

}  // namespace

void reduce_dim(ReduceOp op, DType dt, const void* in, void* out, int64_t outer, int64_t dim, int64_t inner,
                int64_t* argmax) {
  reduce_any(op, dt, dt, in, out, outer, dim, inner, argmax);
}

void reduce_dim(ReduceOp op, DType dt, DType out_dt, const void* in, void* out, int64_t outer, int64_t dim,
                int64_t inner) {
  reduce_any(op, dt, out_dt, in, out, outer, dim, inner, nullptr);
}

}  // namespace bt::kernels::cpu
