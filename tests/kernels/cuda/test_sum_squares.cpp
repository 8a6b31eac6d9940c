// GPU sum_squares (kernels/sum_squares.h) against a float64 host sum: buffer
// sizes around the chunk size, empty buffers, bf16, a misaligned start (the
// scalar path), more buffers than one launch takes, and bitwise repeatability.
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/sum_squares.h"
#include "tests/kernels/cuda/gpu_test_util.h"

namespace bt::test::gpu {
namespace {
namespace cuda = kernels::cuda;

struct Case {
  std::vector<HostBuf> host;
  std::vector<DevBuf> dev;
  std::vector<kernels::SquaresInput> in;
  double want = 0;

  /// Adds n elements of dt, stored `offset` elements into its device buffer.
  void add(DType dt, int64_t n, std::mt19937& gen, int64_t offset = 0) {
    HostBuf h = randn_buf(dt, n + offset, gen);
    for (int64_t i = offset; i < n + offset; ++i) want += h.get(i) * h.get(i);
    dev.emplace_back(h);
    const auto* base = static_cast<const unsigned char*>(dev.back().get());
    in.push_back({dt, base + offset * static_cast<int64_t>(dtype_size(dt)), n});
    host.push_back(std::move(h));
  }
  float run() {
    DevBuf out(sizeof(float)),
        scratch(cuda::sum_squares_scratch_floats(in.data(), static_cast<int>(in.size())) * sizeof(float));
    out.poison();
    cuda::sum_squares(in.data(), static_cast<int>(in.size()), out.as<float>(), scratch.as<float>(), nullptr);
    return out.to_vector<float>(1)[0];
  }
};

TEST(CudaSumSquares, MatchesFloat64) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  Case c;
  for (int64_t n : {1, 3, 8191, 8192, 8193, 100003, 0, 2 * 8192 + 5}) c.add(DType::F32, n, gen);
  c.add(DType::F32, 40000, gen, 1);  // a start 4 bytes past a 16-byte boundary
  c.add(DType::BF16, 30001, gen);
  c.add(DType::BF16, 7, gen, 3);
  const float got = c.run();
  EXPECT_NEAR(got, c.want, 2e-6 * c.want);
  EXPECT_EQ(c.run(), got) << "two runs on the same data must agree bitwise";
}

TEST(CudaSumSquares, ManyBuffersSpanSeveralLaunches) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  Case c;
  for (int i = 0; i < 150; ++i) c.add(i % 3 ? DType::F32 : DType::BF16, 1 + (i * 997) % 20000, gen);
  EXPECT_NEAR(c.run(), c.want, 2e-6 * c.want);
}

TEST(CudaSumSquares, NothingToAddIsZero) {
  BT_SKIP_WITHOUT_GPU();
  std::mt19937 gen(1);
  Case c;
  EXPECT_EQ(c.run(), 0.0f);
  c.add(DType::F32, 0, gen);
  EXPECT_EQ(c.run(), 0.0f);
}

TEST(CudaSumSquares, BadInputIsNamed) {
  BT_SKIP_WITHOUT_GPU();
  DevBuf out(sizeof(float)), scratch(sizeof(float)), data(64);
  const kernels::SquaresInput bad_dtype{DType::I32, data.get(), 4};
  EXPECT_THROW(
      {
        try {
          cuda::sum_squares(&bad_dtype, 1, out.as<float>(), scratch.as<float>(), nullptr);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("input 0 has dtype"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  const kernels::SquaresInput null_data{DType::F32, nullptr, 4};
  EXPECT_THROW(cuda::sum_squares(&null_data, 1, out.as<float>(), scratch.as<float>(), nullptr), Error);
}

}  // namespace
}  // namespace bt::test::gpu
