// GPU strided_scatter and argmax_scatter against the CPU kernels, bit for bit:
// every dtype size, layouts with gaps (which must keep the poison they start
// with), and destinations big enough for a grid of many blocks.
#include <algorithm>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/scatter.h"
#include "tests/kernels/cuda/gpu_test_util.h"
#include "tests/kernels/strided_view.h"

namespace bt::test::gpu {
namespace {
namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;
using kernels::StridedLayout;

TEST(CudaScatter, StridedScatterMatchesCpuBitwise) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(static_cast<uint32_t>(seed));
  std::uniform_int_distribution<int> byte(0, 255);
  // No repeated offsets: which of two GPU threads writes last is unspecified.
  const std::vector<StridedView> cases = {
      {{}, {}, 3},                                                // scalar
      {{1000}, {1}, 1},                                           // contiguous at an odd offset
      {{13, 7}, {1, 13}, 0},                                      // transpose of [7, 13]
      {{4, 5}, {16, 2}, 3},                                       // every other element of rows of 16
      {{3, 17, 5}, {85, 1, 17}, 0},                               // permuted ndim 3
      {{2, 3, 4, 5}, {200, 60, 12, 2}, 1},                        // gaps in every dim
      {{129, 65}, {-65, 1}, 128 * 65},                            // flipped rows
      {{1, 2, 1, 2, 1, 2, 1, 3}, {0, 40, 0, 20, 0, 9, 0, 2}, 0},  // kMaxDims
      {{0, 5}, {5, 1}, 0},                                        // empty
      {{160, 3000}, {1, 170}, 5},                                 // 480000 elements, transposed, gaps
      {{6, 33}, {40, 1}, 2},                                      // rows in a wider pitch (cudaMemcpy2D)
      {{2, 500, 256}, {640000, 1280, 1}, 768},                    // v's third of a [B, T, 1280] q|k|v
  };
  for (const StridedView& v : cases)
    for (DType dt : kAllDTypes) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " ndim " << v.shape.size() << " offset "
                                        << v.offset << " extent " << v.extent());
      const size_t es = dtype_size(dt);
      HostBuf src(dt, v.numel());  // random bytes: every bit pattern must move unchanged
      for (auto& b : src.bytes) b = static_cast<unsigned char>(byte(gen));
      // One element more than the view spans, so an overrun lands on a checked byte.
      HostBuf ref(dt, v.extent() + 1);
      std::fill(ref.bytes.begin(), ref.bytes.end(), 0xFF);  // the bytes DevBuf::poison writes
      cpu::strided_scatter(dt, src.data(), ref.bytes.data() + v.offset * es, v.layout());
      DevBuf dsrc(src), ddst(ref.size_bytes());
      ddst.poison();
      cuda::strided_scatter(dt, dsrc.get(), ddst.as<unsigned char>() + v.offset * es, v.layout(), nullptr);
      const HostBuf out = ddst.to_host(dt, ref.n);
      const int64_t bad = first_byte_mismatch(out.bytes, ref.bytes, es);
      EXPECT_EQ(bad, -1) << "first mismatch at destination element " << bad << ": gpu "
                         << (bad >= 0 ? out.get(bad) : 0) << " cpu " << (bad >= 0 ? ref.get(bad) : 0);
    }
}

TEST(CudaScatter, ArgmaxScatterMatchesCpuBitwise) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(static_cast<uint32_t>(seed));
  struct Shape {
    int64_t outer, dim, inner;
  };
  const Shape shapes[] = {{1, 1, 1}, {7, 31, 1}, {5, 17, 3}, {2, 1, 5}, {4, 129, 33}, {3, 2049, 40}};
  for (DType dt : {DType::F32, DType::BF16})
    for (const Shape& s : shapes) {
      SCOPED_TRACE(::testing::Message()
                   << dtype_name(dt) << " [" << s.outer << ", " << s.dim << ", " << s.inner << "]");
      const int64_t n_dy = s.outer * s.inner, n_dx = s.outer * s.dim * s.inner;
      const HostBuf dy = randn_buf(dt, n_dy, gen);
      std::uniform_int_distribution<int64_t> pick(0, s.dim - 1);
      std::vector<int64_t> am(static_cast<size_t>(n_dy));
      for (auto& j : am) j = pick(gen);
      am[0] = s.dim - 1;  // the last index of the dimension
      HostBuf ref(dt, n_dx);
      cpu::argmax_scatter(dt, dy.data(), am.data(), ref.data(), s.outer, s.dim, s.inner);
      DevBuf ddy(dy), dam = upload_vector(am), ddx(ref.size_bytes());
      ddx.poison();  // NaN: an element the kernel leaves unwritten fails
      cuda::argmax_scatter(dt, ddy.get(), dam.as<int64_t>(), ddx.get(), s.outer, s.dim, s.inner, nullptr);
      const HostBuf out = ddx.to_host(dt, n_dx);
      const int64_t bad = first_byte_mismatch(out.bytes, ref.bytes, dtype_size(dt));
      EXPECT_EQ(bad, -1) << "first mismatch at dx element " << bad << ": gpu "
                         << (bad >= 0 ? out.get(bad) : 0) << " cpu " << (bad >= 0 ? ref.get(bad) : 0);
    }
}

TEST(CudaScatter, EmptyIsANoOpAndF64ArgmaxIsRefused) {
  BT_SKIP_WITHOUT_GPU();
  const StridedLayout empty = StridedView{{0, 5}, {5, 1}, 0}.layout();
  EXPECT_NO_THROW(cuda::strided_scatter(DType::F32, nullptr, nullptr, empty, nullptr));
  EXPECT_NO_THROW(cuda::argmax_scatter(DType::F32, nullptr, nullptr, nullptr, 0, 3, 4, nullptr));
  DevBuf d(64);
  EXPECT_THROW(cuda::argmax_scatter(DType::F64, d.get(), d.as<int64_t>(), d.get(), 1, 1, 1, nullptr),
               bt::Error);
  sync();
}

}  // namespace
}  // namespace bt::test::gpu
