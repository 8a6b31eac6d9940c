// GPU random fills must be bitwise identical to the CPU fills for the same
// (seed, offset), at odd sizes, odd offsets and unaligned destinations.
#include <vector>

#include <gtest/gtest.h>

#include "kernels/random.h"
#include "tests/kernels/cuda/gpu_test_util.h"

namespace bt::test::gpu {
namespace {
namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

struct Fill {
  bool normal;
  float a, b;  // lo/hi or mean/std
};

void check_fill(DType dt, const Fill& f, int64_t n, uint64_t seed, uint64_t offset, int64_t dst_off) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << (f.normal ? " normal(" : " uniform(") << f.a << ", "
                                    << f.b << ") n " << n << " seed " << seed << " offset " << offset
                                    << " dst+" << dst_off);
  const size_t es = dtype_size(dt);
  HostBuf ref(dt, n);
  if (f.normal)
    cpu::fill_normal(dt, ref.data(), n, seed, offset, f.a, f.b);
  else
    cpu::fill_uniform(dt, ref.data(), n, seed, offset, f.a, f.b);
  DevBuf d(static_cast<size_t>(n + dst_off) * es);
  d.poison();
  void* dst = d.as<unsigned char>() + dst_off * es;
  if (f.normal)
    cuda::fill_normal(dt, dst, n, seed, offset, f.a, f.b, nullptr);
  else
    cuda::fill_uniform(dt, dst, n, seed, offset, f.a, f.b, nullptr);
  const HostBuf all = d.to_host(dt, n + dst_off);
  std::vector<unsigned char> got(all.bytes.begin() + dst_off * es, all.bytes.end());
  const int64_t bad = first_byte_mismatch(got, ref.bytes, es);
  EXPECT_EQ(bad, -1) << "element " << bad << ": gpu " << (bad >= 0 ? load_as(dt, got.data(), bad) : 0.0)
                     << " cpu " << (bad >= 0 ? ref.get(bad) : 0.0);
  // Sanity: the values are finite and not all equal.
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) finite = finite && std::isfinite(ref.get(i));
  EXPECT_TRUE(finite);
}

TEST(CudaRandom, UniformAndNormalMatchCpuBitwise) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(s);
  std::mt19937_64 gen(s);
  const Fill fills[] = {{false, 0.0f, 1.0f}, {false, -0.1f, 0.3f}, {true, 0.0f, 1.0f}, {true, 1.5f, 0.02f}};
  for (DType dt : {DType::F32, DType::BF16})
    for (const Fill& f : fills)
      for (int64_t n : {1, 3, 1000, 4099, 100003})
        for (uint64_t offset : {uint64_t{0}, uint64_t{5}, (uint64_t{1} << 32) + 7, gen() >> 1})
          for (int64_t dst_off : {0, 1}) check_fill(dt, f, n, gen(), offset, dst_off);
}

TEST(CudaRandom, SplitFillsEqualOneFill) {
  // Element i depends only on (seed, offset + i): two fills [0, a) and [a, n)
  // with offsets o and o + a equal one fill of n.
  BT_SKIP_WITHOUT_GPU();
  const int64_t n = 10007, a = 4321;
  BT_SEED(seed);
  const uint64_t off = 99;
  DevBuf one(n * sizeof(float)), two(n * sizeof(float));
  cuda::fill_normal(DType::F32, one.get(), n, seed, off, 0.0f, 1.0f, nullptr);
  cuda::fill_normal(DType::F32, two.get(), a, seed, off, 0.0f, 1.0f, nullptr);
  cuda::fill_normal(DType::F32, two.as<float>() + a, n - a, seed, off + a, 0.0f, 1.0f, nullptr);
  EXPECT_EQ(one.to_vector<float>(n), two.to_vector<float>(n));
}

TEST(CudaRandom, RejectsUnsupportedDtype) {
  BT_SKIP_WITHOUT_GPU();
  DevBuf d(64);
  EXPECT_THROW(cuda::fill_uniform(DType::F64, d.get(), 4, 1, 0, 0.0f, 1.0f, nullptr), bt::Error);
  EXPECT_THROW(cuda::fill_normal(DType::I32, d.get(), 4, 1, 0, 0.0f, 1.0f, nullptr), bt::Error);
}

}  // namespace
}  // namespace bt::test::gpu
