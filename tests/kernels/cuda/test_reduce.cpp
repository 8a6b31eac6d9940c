// GPU reduce_dim (sum, mean, max + argmax) against the CPU kernel.
#include <algorithm>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/reduce.h"
#include "tests/kernels/cuda/gpu_test_util.h"

namespace bt::test::gpu {
namespace {
namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;
using kernels::ReduceOp;

struct Shape {
  int64_t outer, dim, inner;
};

TEST(CudaReduce, MatchesCpu) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  const Shape shapes[] = {{1, 1, 1},  {7, 31, 1},   {3, 1000, 1}, {2, 3000, 1}, {129, 768, 1},
                          {5, 17, 3}, {4, 129, 33}, {1, 7, 1000}, {2, 1, 5},    {3, 2049, 40}};
  for (DType dt : {DType::F32, DType::BF16}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max}) {
      for (const Shape& s : shapes) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " op " << static_cast<int>(op) << " ["
                                          << s.outer << ", " << s.dim << ", " << s.inner << "]");
        const int64_t n_in = s.outer * s.dim * s.inner, n_out = s.outer * s.inner;
        // Sums of uniform(0.5, 1.5) stay away from zero, so the relative error is meaningful.
        const HostBuf in = random_buf(dt, n_in, gen, op == ReduceOp::Max ? -1.0 : 0.5, 1.5);
        HostBuf ref(dt, n_out);
        std::vector<int64_t> ref_arg(static_cast<size_t>(n_out), -7);
        cpu::reduce_dim(op, dt, in.data(), ref.data(), s.outer, s.dim, s.inner,
                        op == ReduceOp::Max ? ref_arg.data() : nullptr);
        DevBuf din(in), dout(ref.size_bytes()), darg(static_cast<size_t>(n_out) * sizeof(int64_t));
        dout.poison();
        darg.poison();
        cuda::reduce_dim(op, dt, din.get(), dout.get(), s.outer, s.dim, s.inner,
                         op == ReduceOp::Max ? darg.as<int64_t>() : nullptr, nullptr);
        BT_EXPECT_REL(dout.to_host(dt, n_out).vals(), ref.vals(), op == ReduceOp::Max ? 0.0 + 1e-12 : tol(dt),
                      "reduce");
        if (op == ReduceOp::Max) {
          EXPECT_EQ(darg.to_vector<int64_t>(static_cast<size_t>(n_out)), ref_arg);
        }
      }
    }
  }
}

// The two-pass split (few outputs, long dim: a full sum, a bias gradient over
// B*T rows) against the CPU, and bitwise repeatable.
TEST(CudaReduce, SplitPassMatchesCpuAndRepeats) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  const Shape shapes[] = {{1, 3000001, 1}, {2, 100000, 1}, {1, 16384, 768}, {1, 20001, 37}, {3, 9000, 64}};
  for (DType dt : {DType::F32, DType::BF16}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean}) {
      for (const Shape& s : shapes) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " op " << static_cast<int>(op) << " ["
                                          << s.outer << ", " << s.dim << ", " << s.inner << "]");
        const size_t nscratch = cuda::reduce_dim_scratch_floats(op, s.outer, s.dim, s.inner);
        ASSERT_GT(nscratch, 0u) << "this shape should take the split pass";
        const int64_t n_in = s.outer * s.dim * s.inner, n_out = s.outer * s.inner;
        const HostBuf in = random_buf(dt, n_in, gen, 0.5, 1.5);
        HostBuf ref(dt, n_out);
        cpu::reduce_dim(op, dt, in.data(), ref.data(), s.outer, s.dim, s.inner, nullptr);
        DevBuf din(in), dout(ref.size_bytes()), scratch(nscratch * sizeof(float));
        dout.poison();
        cuda::reduce_dim(op, dt, din.get(), dout.get(), s.outer, s.dim, s.inner, nullptr, scratch.as<float>(),
                         nullptr);
        const auto first = dout.to_host(dt, n_out).vals();
        BT_EXPECT_REL(first, ref.vals(), dt == DType::F32 ? 1e-5 : tol(dt), "split reduce");
        dout.poison();
        cuda::reduce_dim(op, dt, din.get(), dout.get(), s.outer, s.dim, s.inner, nullptr, scratch.as<float>(),
                         nullptr);
        EXPECT_EQ(dout.to_host(dt, n_out).vals(), first) << "two runs differ";
      }
    }
  }
  EXPECT_EQ(cuda::reduce_dim_scratch_floats(ReduceOp::Sum, 4096, 768, 1), 0u) << "wide grids need no split";
  EXPECT_EQ(cuda::reduce_dim_scratch_floats(ReduceOp::Max, 1, 1 << 24, 1), 0u);
}

// Note [Column sums 16 bytes a thread]: the same data, 16-byte aligned (the
// vector kernel) and one element off (the scalar kernel), gives the same
// bits, for f32 and for bf16 summed into f32: the chunks and each column's
// order of addition do not depend on the kernel.
TEST(CudaReduce, ColumnSumsGiveTheSameBitsAlignedOrNot) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  const Shape shapes[] = {{1, 16384, 3072}, {3, 9000, 64}, {2, 5003, 24}, {1, 700, 256}};
  for (DType dt : {DType::F32, DType::BF16}) {
    for (const Shape& s : shapes) {
      SCOPED_TRACE(::testing::Message()
                   << dtype_name(dt) << " [" << s.outer << ", " << s.dim << ", " << s.inner << "]");
      const size_t nscratch = cuda::reduce_dim_scratch_floats(ReduceOp::Sum, s.outer, s.dim, s.inner);
      ASSERT_GT(nscratch, 0u) << "this shape should take the split pass";
      const int64_t n_in = s.outer * s.dim * s.inner, n_out = s.outer * s.inner;
      const HostBuf in = random_buf(dt, n_in, gen, -1.0, 1.5);
      HostBuf ref(DType::F32, n_out);
      cpu::reduce_dim(ReduceOp::Sum, dt, DType::F32, in.data(), ref.data(), s.outer, s.dim, s.inner);
      const size_t es = dtype_size(dt);
      DevBuf din(in.size_bytes() + 16), dout(ref.size_bytes()), scratch(nscratch * sizeof(float));
      std::vector<double> got[2];
      for (int off : {0, 1}) {
        unsigned char* p = din.as<unsigned char>() + off * es;
        BT_CUDA_CHECK(cudaMemcpy(p, in.data(), in.size_bytes(), cudaMemcpyHostToDevice));
        dout.poison();
        cuda::reduce_dim(ReduceOp::Sum, dt, DType::F32, p, dout.get(), s.outer, s.dim, s.inner,
                         scratch.as<float>(), nullptr);
        got[off] = dout.to_host(DType::F32, n_out).vals();
      }
      BT_EXPECT_REL(got[0], ref.vals(), 1e-5, "aligned");
      EXPECT_EQ(got[0], got[1]) << "aligned and unaligned inputs differ";
    }
  }
}

// Note [Sums over a short dim, 8 bytes a thread]: a short dim over a wide
// inner one -- GPT's position-embedding gradient, [1, 16, 1024 x 768] -- gives
// the same bits 8-byte aligned (a thread per pack) and one element off (the
// 32 x 8 blocks), Sum and Mean, f32 and bf16 into f32, dim below and above 8.
TEST(CudaReduce, ShortDimSumsGiveTheSameBitsAlignedOrNot) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  const Shape shapes[] = {{1, 16, 1024 * 768}, {3, 5, 256}, {2, 64, 40}, {1, 9, 8}};
  for (DType dt : {DType::F32, DType::BF16}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean}) {
      for (const Shape& s : shapes) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " op " << static_cast<int>(op) << " ["
                                          << s.outer << ", " << s.dim << ", " << s.inner << "]");
        ASSERT_EQ(cuda::reduce_dim_scratch_floats(op, s.outer, s.dim, s.inner), 0u) << "a one-pass shape";
        const int64_t n_in = s.outer * s.dim * s.inner, n_out = s.outer * s.inner;
        const HostBuf in = random_buf(dt, n_in, gen, -1.0, 1.5);
        HostBuf ref(DType::F32, n_out);
        cpu::reduce_dim(op, dt, DType::F32, in.data(), ref.data(), s.outer, s.dim, s.inner);
        const size_t es = dtype_size(dt);
        DevBuf din(in.size_bytes() + 16), dout(ref.size_bytes());
        std::vector<double> got[2];
        for (int off : {0, 1}) {
          unsigned char* p = din.as<unsigned char>() + off * es;
          BT_CUDA_CHECK(cudaMemcpy(p, in.data(), in.size_bytes(), cudaMemcpyHostToDevice));
          dout.poison();
          cuda::reduce_dim(op, dt, DType::F32, p, dout.get(), s.outer, s.dim, s.inner, nullptr, nullptr);
          got[off] = dout.to_host(DType::F32, n_out).vals();
        }
        BT_EXPECT_REL(got[0], ref.vals(), 1e-5, "aligned");
        EXPECT_EQ(got[0], got[1]) << "aligned and unaligned inputs differ";
      }
    }
  }
}

// A bf16 input summed into an f32 output (a bias gradient for an f32 master),
// one pass and split, against the CPU's at f32's tolerance (an output rounded
// to bf16 fails it), and the split bitwise repeatable.
TEST(CudaReduce, Bf16IntoF32MatchesCpu) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  const Shape shapes[] = {{7, 31, 1},      {2, 3000, 1},   {4, 129, 33},
                          {1, 16384, 768}, {1, 20001, 37}, {3, 9000, 64}};
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean}) {
    for (const Shape& s : shapes) {
      for (bool split : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "op " << static_cast<int>(op) << " [" << s.outer << ", " << s.dim
                                          << ", " << s.inner << "] split " << split);
        const size_t nscratch = split ? cuda::reduce_dim_scratch_floats(op, s.outer, s.dim, s.inner) : 0;
        if (split && nscratch == 0) continue;
        const int64_t n_in = s.outer * s.dim * s.inner, n_out = s.outer * s.inner;
        const HostBuf in = random_buf(DType::BF16, n_in, gen, 0.5, 1.5);
        HostBuf ref(DType::F32, n_out);
        cpu::reduce_dim(op, DType::BF16, DType::F32, in.data(), ref.data(), s.outer, s.dim, s.inner);
        DevBuf din(in), dout(ref.size_bytes()), scratch(std::max<size_t>(nscratch, 1) * sizeof(float));
        float* sp = split ? scratch.as<float>() : nullptr;
        dout.poison();
        cuda::reduce_dim(op, DType::BF16, DType::F32, din.get(), dout.get(), s.outer, s.dim, s.inner, sp,
                         nullptr);
        const auto first = dout.to_host(DType::F32, n_out).vals();
        BT_EXPECT_REL(first, ref.vals(), 1e-5, "bf16 into f32");
        dout.poison();
        cuda::reduce_dim(op, DType::BF16, DType::F32, din.get(), dout.get(), s.outer, s.dim, s.inner, sp,
                         nullptr);
        EXPECT_EQ(dout.to_host(DType::F32, n_out).vals(), first) << "two runs differ";
      }
    }
  }
  DevBuf d(64);
  EXPECT_THROW(
      cuda::reduce_dim(ReduceOp::Max, DType::BF16, DType::F32, d.get(), d.get(), 1, 4, 1, nullptr, nullptr),
      bt::Error);
  EXPECT_THROW(
      cuda::reduce_dim(ReduceOp::Sum, DType::F32, DType::BF16, d.get(), d.get(), 1, 4, 1, nullptr, nullptr),
      bt::Error);
}

TEST(CudaReduce, MaxPropagatesNanAndTiesTakeFirstIndex) {
  BT_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int64_t dim : {5, 100, 5000}) {
      for (int64_t inner : {1, 3}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " dim " << dim << " inner " << inner);
        // Row 0: all equal (ties) -> index 0. Row 1: NaN at dim/2 and at dim-1 -> first NaN.
        const int64_t outer = 2;
        std::vector<double> v(static_cast<size_t>(outer * dim * inner), 1.0);
        for (int64_t i = 0; i < inner; ++i) {
          v[static_cast<size_t>((1 * dim + dim / 2) * inner + i)] = std::numeric_limits<double>::quiet_NaN();
          v[static_cast<size_t>((1 * dim + dim - 1) * inner + i)] = std::numeric_limits<double>::quiet_NaN();
        }
        const HostBuf in(dt, v);
        DevBuf din(in), dout(static_cast<size_t>(outer * inner) * dtype_size(dt)),
            darg(static_cast<size_t>(outer * inner) * sizeof(int64_t));
        cuda::reduce_dim(ReduceOp::Max, dt, din.get(), dout.get(), outer, dim, inner, darg.as<int64_t>(),
                         nullptr);
        const HostBuf out = dout.to_host(dt, outer * inner);
        const auto arg = darg.to_vector<int64_t>(static_cast<size_t>(outer * inner));
        for (int64_t i = 0; i < inner; ++i) {
          EXPECT_EQ(out.get(i), 1.0);
          EXPECT_EQ(arg[static_cast<size_t>(i)], 0);
          EXPECT_TRUE(std::isnan(out.get(inner + i)));
          EXPECT_EQ(arg[static_cast<size_t>(inner + i)], dim / 2);
        }
      }
    }
  }
}

TEST(CudaReduce, MaxOverEmptyDimThrows) {
  BT_SKIP_WITHOUT_GPU();
  DevBuf d(64);
  EXPECT_THROW(cuda::reduce_dim(ReduceOp::Max, DType::F32, d.get(), d.get(), 2, 0, 1, nullptr, nullptr),
               bt::Error);
}

}  // namespace
}  // namespace bt::test::gpu
