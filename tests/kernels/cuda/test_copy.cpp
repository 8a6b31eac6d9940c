// GPU copy / cast / fill / arange against the CPU kernels, bit for bit, for
// every dtype pair and strided layouts of odd sizes.
#include <algorithm>
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/copy.h"
#include "tests/kernels/cuda/gpu_test_util.h"
#include "tests/kernels/strided_view.h"

namespace bt::test::gpu {
namespace {
namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;
using kernels::StridedLayout;

/// Source values valid for `dt` (ints stay in range; floats include specials).
HostBuf source_values(DType dt, int64_t n, std::mt19937& gen) {
  HostBuf h(dt, n);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  const double specials[] = {0.0,    -0.0, 1.0,   -1.0,    0.5,     2.5,   -2.5,   300.75,
                             -129.5, 1e10, -1e10, 65519.0, 70000.0, 1e-30, 3.0e38, 1e-45};
  for (int64_t i = 0; i < n; ++i) {
    double x;
    if (is_floating(dt)) {
      x = (i % 5 == 0) ? specials[(i / 5) % (sizeof(specials) / sizeof(double))] : u(gen) * 1000.0;
      if (dt == DType::F64 && i % 7 == 3) x = 1e300 * u(gen);  // overflows f32/bf16/f16
    } else if (dt == DType::Bool) {
      x = u(gen) > 0 ? 1 : 0;
    } else if (dt == DType::U8) {
      x = std::floor((u(gen) + 1.0) * 127.0);
    } else if (dt == DType::U16) {
      x = std::floor((u(gen) + 1.0) * 32000.0);
    } else if (dt == DType::I64 && i % 9 == 4) {
      x = u(gen) * 9e18;  // beyond 2^53: exercises the int64 -> float rounding
    } else {
      x = std::floor(u(gen) * 100000.0);
    }
    h.set(i, x);
  }
  return h;
}

const std::vector<StridedView>& layout_cases() {
  static const std::vector<StridedView> cases = {
      {{}, {}, 0},                           // scalar
      {{1}, {1}, 0},                         //
      {{37}, {1}, 0},                        // contiguous
      {{1000}, {1}, 3},                      // contiguous at an odd offset
      {{13, 7}, {1, 13}, 0},                 // transpose
      {{5, 9, 3}, {0, 3, 1}, 1},             // broadcast outer dim
      {{4, 1, 33}, {40, 7, 1}, 2},           // padded rows + size-1 dim
      {{3, 17, 5}, {85, 1, 17}, 0},          // permuted
      {{129, 65}, {-65, 1}, 129 * 65 - 65},  // negative stride (flipped rows)
      {{3, 70, 48}, {9600, 80, 1}, 16},      // rows in a wider pitch (cudaMemcpy2D when the dtypes match)
  };
  return cases;
}

TEST(CudaCopy, StridedCopyAllDtypePairsBitwise) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  for (DType src_dt : kAllDTypes) {
    for (DType dst_dt : kAllDTypes) {
      for (const StridedView& lc : layout_cases()) {
        SCOPED_TRACE(::testing::Message() << dtype_name(src_dt) << " -> " << dtype_name(dst_dt) << " ndim "
                                          << lc.shape.size() << " offset " << lc.offset);
        const StridedLayout l = lc.layout();
        const int64_t n = lc.numel();
        const HostBuf src = source_values(src_dt, lc.extent(), gen);
        const size_t es_src = dtype_size(src_dt), es_dst = dtype_size(dst_dt);
        HostBuf ref(dst_dt, n);
        cpu::strided_copy(src_dt, static_cast<const unsigned char*>(src.data()) + lc.offset * es_src, l,
                          dst_dt, ref.data());
        DevBuf dsrc(src);
        DevBuf ddst(static_cast<size_t>(n) * es_dst);
        ddst.poison();
        cuda::strided_copy(src_dt, dsrc.as<unsigned char>() + lc.offset * es_src, l, dst_dt, ddst.get(),
                           nullptr);
        const HostBuf out = ddst.to_host(dst_dt, n);
        const int64_t bad = first_byte_mismatch(out.bytes, ref.bytes, es_dst);
        EXPECT_EQ(bad, -1) << "first mismatch at element " << bad << ": gpu " << (bad >= 0 ? out.get(bad) : 0)
                           << " cpu " << (bad >= 0 ? ref.get(bad) : 0);
      }
    }
  }
}

TEST(CudaCopy, FillAllDtypesBitwise) {
  BT_SKIP_WITHOUT_GPU();
  const double values[] = {0.0, 1.5, -3.0, 1e10, -1e10, 257.9, 1e-40, 65520.0};
  for (DType dt : kAllDTypes) {
    for (int64_t n : {1, 7, 1000, 4097}) {
      for (int64_t off : {0, 1}) {
        for (double v : values) {
          SCOPED_TRACE(::testing::Message()
                       << dtype_name(dt) << " n " << n << " offset " << off << " value " << v);
          const size_t es = dtype_size(dt);
          HostBuf ref(dt, n);
          cpu::fill(dt, ref.data(), n, v);
          DevBuf d(static_cast<size_t>(n + off) * es);
          d.poison();
          cuda::fill(dt, d.as<unsigned char>() + off * es, n, v, nullptr);
          HostBuf all = d.to_host(dt, n + off);
          std::vector<unsigned char> got(all.bytes.begin() + off * es, all.bytes.end());
          EXPECT_EQ(first_byte_mismatch(got, ref.bytes, es), -1);
        }
      }
    }
  }
}

TEST(CudaCopy, ArangeAllDtypesBitwise) {
  BT_SKIP_WITHOUT_GPU();
  const std::pair<double, double> params[] = {{0.0, 1.0}, {-5.0, 0.5}, {3.0, -0.25}, {0.1, 0.1}, {1e6, 7.0}};
  for (DType dt : kAllDTypes) {
    for (int64_t n : {1, 33, 1000}) {
      for (auto [start, step] : params) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dt) << " n " << n << " start " << start << " step " << step);
        const size_t es = dtype_size(dt);
        HostBuf ref(dt, n);
        cpu::arange(dt, ref.data(), n, start, step);
        DevBuf d(static_cast<size_t>(n) * es);
        d.poison();
        cuda::arange(dt, d.get(), n, start, step, nullptr);
        const HostBuf out = d.to_host(dt, n);
        const int64_t bad = first_byte_mismatch(out.bytes, ref.bytes, es);
        EXPECT_EQ(bad, -1) << "element " << bad << ": gpu " << (bad >= 0 ? out.get(bad) : 0) << " cpu "
                           << (bad >= 0 ? ref.get(bad) : 0);
      }
    }
  }
}

TEST(CudaCopy, EmptyIsANoOp) {
  BT_SKIP_WITHOUT_GPU();
  StridedLayout l;
  l.ndim = 2;
  l.shape[0] = 0;
  l.shape[1] = 5;
  l.strides[0] = 5;
  l.strides[1] = 1;
  EXPECT_NO_THROW(cuda::strided_copy(DType::F32, nullptr, l, DType::BF16, nullptr, nullptr));
  EXPECT_NO_THROW(cuda::fill(DType::F32, nullptr, 0, 1.0, nullptr));
  EXPECT_NO_THROW(cuda::arange(DType::I64, nullptr, 0, 0.0, 1.0, nullptr));
  sync();
}

}  // namespace
}  // namespace bt::test::gpu
