// strided_scatter and argmax_scatter (kernels/scatter.h) against plain
// reference loops: every dtype size, layouts with gaps that must stay
// untouched, and a destination large enough to be split across threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/parallel.h"
#include "kernels/scatter.h"
#include "tests/kernels/cpu/kernel_test_util.h"
#include "tests/kernels/strided_view.h"

namespace bt::test {
namespace {
namespace cpu = kernels::cpu;
using kernels::StridedLayout;

using Bytes = std::vector<unsigned char>;

Bytes random_bytes(size_t n, std::mt19937& gen) {
  std::uniform_int_distribution<int> d(0, 255);
  Bytes b(n);
  for (auto& x : b) x = static_cast<unsigned char>(d(gen));
  return b;
}

struct ScatterCase {
  const char* name;
  StridedView view;
};

/// The reference: a multi-index counted up in row-major order (last index
/// fastest), each element's bytes copied to offset + sum(index * stride).
Bytes scatter_ref(const Bytes& src, Bytes dst, const StridedView& c, size_t es) {
  const size_t nd = c.shape.size();
  for (int64_t s : c.shape)
    if (s == 0) return dst;
  std::vector<int64_t> idx(nd, 0);
  for (int64_t i = 0;; ++i) {
    int64_t off = c.offset;
    for (size_t d = 0; d < nd; ++d) off += idx[d] * c.strides[d];
    std::copy_n(src.begin() + i * es, es, dst.begin() + off * es);
    size_t d = nd;
    while (d > 0 && ++idx[d - 1] == c.shape[d - 1]) idx[--d] = 0;
    if (d == 0) return dst;
  }
}

/// Index of the first `es`-byte element where a and b differ, or -1.
int64_t first_mismatch(const Bytes& a, const Bytes& b, size_t es) {
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<int64_t>(i / es);
  return -1;
}

bool same_element(const Bytes& a, const Bytes& b, int64_t i, size_t es) {
  return std::equal(a.begin() + i * es, a.begin() + (i + 1) * es, b.begin() + i * es);
}

/// Sets the pool size for a scope and restores the default after.
struct Threads {
  explicit Threads(int n) { cpu::set_num_threads(n); }
  ~Threads() { cpu::set_num_threads(0); }
};

TEST(ScatterCpu, StridedScatterMatchesAPlainLoop) {
  const std::vector<ScatterCase> cases = {
      {"scalar", {{}, {}, 3}},
      {"contiguous", {{37}, {1}, 0}},
      {"transpose of [7, 13]", {{13, 7}, {1, 13}, 0}},
      {"every other element of rows of 16", {{4, 5}, {16, 2}, 3}},
      {"permuted ndim 3", {{3, 17, 5}, {85, 1, 17}, 0}},
      {"ndim 4 with gaps in every dim", {{2, 3, 4, 5}, {200, 60, 12, 2}, 1}},
      {"flipped rows (negative stride: serial path)", {{9, 6}, {-6, 1}, 48}},
      {"repeated offsets: the last write wins", {{3, 4}, {0, 1}, 2}},
      {"kMaxDims", {{1, 2, 1, 2, 1, 2, 1, 3}, {0, 40, 0, 20, 0, 9, 0, 2}, 0}},
      {"empty", {{0, 5}, {5, 1}, 0}},
      // 48000 elements: more than one chunk of 2^15, split mid-row.
      {"large transposed with gaps (parallel)", {{160, 300}, {1, 170}, 5}},
  };
  Threads threads(3);
  std::mt19937 gen(20240917);
  for (const auto& [name, v] : cases)
    for (DType dt : kAllDTypes) {
      SCOPED_TRACE(::testing::Message() << name << ", " << dtype_name(dt));
      const size_t es = dtype_size(dt);
      // Random bytes: every bit pattern (NaN payloads too) must move unchanged.
      // One element more than the view spans, so an overrun lands on a checked byte.
      const Bytes src = random_bytes(static_cast<size_t>(v.numel()) * es, gen);
      const Bytes before = random_bytes(static_cast<size_t>(v.extent() + 1) * es, gen);
      const Bytes want = scatter_ref(src, before, v, es);
      Bytes got = before;
      cpu::strided_scatter(dt, src.data(), got.data() + v.offset * es, v.layout());
      const int64_t bad = first_mismatch(got, want, es);
      EXPECT_EQ(bad, -1) << "destination element " << bad
                         << (bad >= 0 && same_element(want, before, bad, es)
                                 ? " lies outside the view, so it must keep its value"
                                 : " is a scattered element");
    }
}

TEST(ScatterCpu, ArgmaxScatterZeroesAllButTheArgmax) {
  const int64_t outer = 3, dim = 5, inner = 7;
  std::mt19937 gen(7);
  std::uniform_int_distribution<int64_t> pick(0, dim - 1);
  std::vector<int64_t> am(outer * inner);
  for (auto& j : am) j = pick(gen);
  am[0] = 0, am[1] = dim - 1;  // both ends of the dimension
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Buf dy = rand_buf(dt, static_cast<size_t>(outer * inner), 11);
    Buf dx(dt, std::vector<double>(static_cast<size_t>(outer * dim * inner), NAN));  // poisoned
    cpu::argmax_scatter(dt, dy.data(), am.data(), dx.data(), outer, dim, inner);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < dim; ++j)
        for (int64_t i = 0; i < inner; ++i) {
          const double want = am[o * inner + i] == j ? dy.get(o * inner + i) : 0.0;
          ASSERT_EQ(dx.get((o * dim + j) * inner + i), want) << "o " << o << " j " << j << " i " << i;
        }
  }
}

TEST(ScatterCpu, Errors) {
  std::vector<unsigned char> buf(64);
  StridedLayout l;
  l.ndim = 9;
  expect_error([&] { cpu::strided_scatter(DType::F32, buf.data(), buf.data() + 32, l); }, "strided_scatter");
  l.ndim = 1, l.shape[0] = -2, l.strides[0] = 1;
  expect_error([&] { cpu::strided_scatter(DType::F32, buf.data(), buf.data() + 32, l); }, "negative");
  const int64_t am = 0;
  expect_error([&] { cpu::argmax_scatter(DType::I32, buf.data(), &am, buf.data() + 32, 1, 1, 1); },
               "argmax_scatter");
}

}  // namespace
}  // namespace bt::test
