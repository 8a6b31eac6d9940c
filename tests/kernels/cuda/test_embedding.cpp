// GPU embedding forward/backward against the CPU kernels, the out-of-range
// counter, and bitwise determinism of the backward with many repeated indices.
#include <cstring>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/embedding.h"
#include "tests/kernels/cuda/gpu_test_util.h"

namespace bt::test::gpu {
namespace {
namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

std::vector<int32_t> random_indices(int64_t n, int64_t num, std::mt19937& gen) {
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(num - 1));
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(gen);
  return v;
}

TEST(CudaEmbedding, ForwardAndBackwardMatchCpu) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int64_t num : {1, 50, 1000}) {
      for (int64_t dim : {1, 7, 64, 768}) {
        for (int64_t n : {1, 100, 5000}) {
          SCOPED_TRACE(::testing::Message()
                       << dtype_name(dt) << " num " << num << " dim " << dim << " n " << n);
          const size_t es = dtype_size(dt);
          const HostBuf table = randn_buf(dt, num * dim, gen);
          const std::vector<int32_t> idx = random_indices(n, num, gen);
          HostBuf out_ref(dt, n * dim);
          cpu::embedding_forward(dt, table.data(), num, dim, idx.data(), n, out_ref.data());
          DevBuf dtab(table), didx(upload_vector(idx)), dout(static_cast<size_t>(n * dim) * es);
          dout.poison();
          cuda::embedding_forward(dt, dtab.get(), num, dim, didx.as<int32_t>(), n, dout.get(), nullptr);
          const HostBuf out = dout.to_host(dt, n * dim);
          EXPECT_EQ(first_byte_mismatch(out.bytes, out_ref.bytes, es), -1) << "forward";

          const HostBuf g = randn_buf(dt, n * dim, gen);
          HostBuf dtab_ref(dt, num * dim);
          cpu::embedding_backward(dt, g.data(), idx.data(), n, num, dim, dtab_ref.data());
          DevBuf dg(g), ddtab(static_cast<size_t>(num * dim) * es);
          DevBuf scratch(cuda::embedding_backward_scratch_floats(n, num) * sizeof(float));
          ddtab.poison();
          scratch.poison();
          cuda::embedding_backward(dt, dt, dg.get(), didx.as<int32_t>(), n, num, dim, ddtab.get(), false,
                                   scratch.as<float>(), nullptr);
          BT_EXPECT_REL(ddtab.to_host(dt, num * dim).vals(), dtab_ref.vals(), tol(dt), "backward");
        }
      }
    }
  }
}

TEST(CudaEmbedding, BackwardIsBitwiseDeterministic) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  for (DType dt : {DType::F32, DType::BF16}) {
    const int64_t num = 1000, dim = 768, n = 20000;
    // Heavy repetition: most indices hit 3 rows.
    std::vector<int32_t> idx = random_indices(n, 3, gen);
    for (size_t i = 0; i < idx.size(); i += 7) idx[i] = static_cast<int32_t>(gen() % num);
    const HostBuf g = randn_buf(dt, n * dim, gen);
    DevBuf didx(upload_vector(idx)), dg(g);
    DevBuf scratch(cuda::embedding_backward_scratch_floats(n, num) * sizeof(float));
    std::vector<unsigned char> first;
    for (int run = 0; run < 3; ++run) {
      DevBuf dtab(static_cast<size_t>(num * dim) * dtype_size(dt));
      dtab.poison();
      cuda::embedding_backward(dt, dt, dg.get(), didx.as<int32_t>(), n, num, dim, dtab.get(), false,
                               scratch.as<float>(), nullptr);
      const HostBuf out = dtab.to_host(dt, num * dim);
      if (run == 0)
        first = out.bytes;
      else
        EXPECT_EQ(first_byte_mismatch(out.bytes, first, dtype_size(dt)), -1)
            << dtype_name(dt) << " run " << run;
    }
    // And equal to the CPU (same summation order: index order, in float).
    HostBuf ref(dt, num * dim);
    cpu::embedding_backward(dt, g.data(), idx.data(), n, num, dim, ref.data());
    HostBuf firstbuf(dt, num * dim);
    firstbuf.bytes = first;
    BT_EXPECT_REL(firstbuf.vals(), ref.vals(), tol(dt), "backward vs cpu");
  }
}

// A bf16 gradient summed into an f32 table (the gradient of a bf16 table cast
// from an f32 master): against the CPU's at f32's tolerance (a table rounded
// to bf16 fails it), bitwise repeatable, with no scratch.
TEST(CudaEmbedding, Bf16IntoF32MatchesCpu) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  for (int64_t num : {50, 1000}) {
    for (int64_t dim : {7, 768}) {
      const int64_t n = 5000;
      SCOPED_TRACE(::testing::Message() << "num " << num << " dim " << dim << " n " << n);
      std::vector<int32_t> idx = random_indices(n, num, gen);
      for (size_t i = 0; i < idx.size(); i += 3) idx[i] = 1;  // a row with many terms
      const HostBuf g = randn_buf(DType::BF16, n * dim, gen);
      HostBuf ref(DType::F32, num * dim);
      cpu::embedding_backward(DType::BF16, DType::F32, g.data(), idx.data(), n, num, dim, ref.data());
      DevBuf dg(g), didx(upload_vector(idx)), dtab(static_cast<size_t>(num * dim) * sizeof(float));
      DevBuf scratch(cuda::embedding_backward_scratch_floats(n, num) * sizeof(float));
      std::vector<double> first;
      for (int run = 0; run < 2; ++run) {
        dtab.poison();
        cuda::embedding_backward(DType::BF16, DType::F32, dg.get(), didx.as<int32_t>(), n, num, dim,
                                 dtab.get(), false, scratch.as<float>(), nullptr);
        const std::vector<double> got = dtab.to_host(DType::F32, num * dim).vals();
        if (run == 0) first = got;
        EXPECT_EQ(got, first) << "two runs differ";
      }
      BT_EXPECT_REL(first, ref.vals(), 1e-5, "bf16 into f32");
    }
  }
}

// Note [The embedding backward by sorted runs]: each row sums in index order
// from zero, and with accumulate that sum is added onto what the table holds,
// as on the CPU, so the bits are the CPU's -- for a row of many terms (a frequent
// token: runs longer than the four loads in flight) and for rows no index
// names, which accumulate leaves as they were. Indices outside [0, num) add
// nothing (the CPU, which refuses them, runs without them).
TEST(CudaEmbedding, BackwardIsTheCpuBitsOntoZerosOrTheTable) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  const std::pair<DType, DType> dtypes[] = {
      {DType::F32, DType::F32}, {DType::BF16, DType::BF16}, {DType::BF16, DType::F32}};
  for (const auto& [dt, gdt] : dtypes) {
    for (int64_t dim : {5, 64, 768}) {
      const int64_t num = 300, n = 4000;
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " into " << dtype_name(gdt) << " dim " << dim);
      std::vector<int32_t> idx = random_indices(n, num, gen);
      for (size_t i = 0; i < idx.size(); i += 4) idx[i] = 7;  // a run of 1000 terms
      std::vector<int32_t> in_range;
      std::vector<size_t> kept;
      for (size_t i = 0; i < idx.size(); ++i) {
        if (i % 97 == 5) idx[i] = i % 2 ? static_cast<int32_t>(num) : -3;  // outside: adds nothing
        if (idx[i] >= 0 && idx[i] < num) in_range.push_back(idx[i]), kept.push_back(i);
      }
      const HostBuf g = randn_buf(dt, n * dim, gen);
      HostBuf g_kept(dt, static_cast<int64_t>(kept.size()) * dim);
      const size_t es = dtype_size(dt);
      for (size_t k = 0; k < kept.size(); ++k)
        std::memcpy(g_kept.bytes.data() + k * dim * es, g.bytes.data() + kept[k] * dim * es, dim * es);
      const HostBuf start = randn_buf(gdt, num * dim, gen);
      DevBuf dg(g), didx(upload_vector(idx));
      DevBuf scratch(cuda::embedding_backward_scratch_floats(n, num) * sizeof(float));
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
        HostBuf ref = start;
        cpu::embedding_backward(dt, gdt, g_kept.data(), in_range.data(),
                                static_cast<int64_t>(in_range.size()), num, dim, ref.data(), accumulate);
        DevBuf dtab(start);
        if (!accumulate) dtab.poison();
        scratch.poison();
        cuda::embedding_backward(dt, gdt, dg.get(), didx.as<int32_t>(), n, num, dim, dtab.get(), accumulate,
                                 scratch.as<float>(), nullptr);
        EXPECT_EQ(first_byte_mismatch(dtab.to_host(gdt, num * dim).bytes, ref.bytes, dtype_size(gdt)), -1);
      }
    }
  }
}

TEST(CudaEmbedding, CountOutOfRange) {
  BT_SKIP_WITHOUT_GPU();
  const std::vector<int32_t> idx = {0, 5, -1, 9, 10, 3, 1000, -7, 2};
  DevBuf didx(upload_vector(idx)), count(sizeof(int));
  count.poison();
  cuda::count_out_of_range(didx.as<int32_t>(), static_cast<int64_t>(idx.size()), 10, count.as<int>(),
                           nullptr);
  EXPECT_EQ(count.to_vector<int>(1)[0], 4);
  // Many indices, across blocks.
  std::vector<int32_t> big(100003, 1);
  for (size_t i = 0; i < big.size(); i += 1000) big[i] = 77;
  DevBuf dbig(upload_vector(big));
  cuda::count_out_of_range(dbig.as<int32_t>(), static_cast<int64_t>(big.size()), 50, count.as<int>(),
                           nullptr);
  EXPECT_EQ(count.to_vector<int>(1)[0], 101);
}

}  // namespace
}  // namespace bt::test::gpu
