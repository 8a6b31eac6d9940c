// Strict-fp32 GEMMs on the FP64 tensor cores (Note [Strict fp32 on the FP64
// tensor cores] in kernels/gemm.h): each element is the float64 product of
// the fp32 inputs rounded once, for every operand layout, ragged tiles,
// padding, batches, alpha, beta and the bias, with K split or not; bitwise
// repeatable; far closer to float64 than cuBLAS's SGEMM; and which GEMMs
// take the path and split K.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/gemm.h"
#include "tests/kernels/cuda/gpu_test_util.h"

namespace bt::test::gpu {
namespace {
namespace cuda = kernels::cuda;
using kernels::Epilogue;
using kernels::GemmArgs;
using kernels::GemmMath;

/// Sets the DMMA switch for a scope.
class DmmaSwitch {
 public:
  explicit DmmaSwitch(bool on) : was_(cuda::gemm_dmma_enabled()) { cuda::set_gemm_dmma(on); }
  ~DmmaSwitch() { cuda::set_gemm_dmma(was_); }
  DmmaSwitch(const DmmaSwitch&) = delete;
  DmmaSwitch& operator=(const DmmaSwitch&) = delete;

 private:
  bool was_;
};

#define BT_SKIP_WITHOUT_DMMA()                                                    \
  do {                                                                            \
    BT_SKIP_WITHOUT_GPU();                                                        \
    if (!cuda::gemm_dmma_available()) GTEST_SKIP() << "no FP64 tensor-core GEMM"; \
  } while (0)

struct Case {
  int64_t m, n, k;
  bool ta, tb;
  int64_t batch = 1, pad = 0;  // pad: extra floats in every leading dimension (a multiple of 4)
  float alpha = 1.0f, beta = 0.0f;
  bool bias = false;
};

/// Runs `c` on the GPU as gemm() chooses, with the scratch gemm_scratch_floats
/// asks for or none (then K is never split: Note [Split K in fp64]), and
/// checks every element of C against the float64 result rounded to fp32:
/// within half an fp32 ulp of it plus the float64 sums' own error (2^-50 of
/// the sum of |terms|, k <= 4096).
void check_case(const Case& c, bool with_scratch, std::mt19937& gen) {
  const int64_t ar = c.ta ? c.k : c.m, ac = c.ta ? c.m : c.k, br = c.tb ? c.n : c.k, bc = c.tb ? c.k : c.n;
  auto chunks = [](int64_t x) { return (x + 3) / 4 * 4; };  // the path's 16-byte rows
  const int64_t lda = chunks(ac) + c.pad, ldb = chunks(bc) + c.pad, ldc = c.n + c.pad;
  // C's batch stride is odd: its second item takes the scalar stores.
  const int64_t sa = ar * lda + 4 * (c.batch > 1), sb = br * ldb + 8 * (c.batch > 1), sc = c.m * ldc + 1;
  const HostBuf A = randn_buf(DType::F32, (c.batch - 1) * sa + ar * lda, gen),
                B = randn_buf(DType::F32, (c.batch - 1) * sb + br * ldb, gen),
                C0 = randn_buf(DType::F32, (c.batch - 1) * sc + c.m * ldc, gen),
                bias = randn_buf(DType::F32, c.n, gen);
  GemmArgs g;
  g.m = c.m, g.n = c.n, g.k = c.k, g.trans_a = c.ta, g.trans_b = c.tb;
  g.lda = lda, g.ldb = ldb, g.ldc = ldc, g.alpha = c.alpha, g.beta = c.beta;
  g.batch = c.batch, g.stride_a = sa, g.stride_b = sb, g.stride_c = sc;
  g.epilogue = c.bias ? Epilogue::Bias : Epilogue::None;
  DevBuf dA(A), dB(B), dC(C0), dC2(C0), dBias(bias);
  g.a = dA.get(), g.b = dB.get(), g.c = dC.get(), g.bias = c.bias ? dBias.get() : nullptr;
  ASSERT_TRUE(cuda::gemm_uses_dmma(g));
  const size_t floats = with_scratch ? cuda::gemm_scratch_floats(g) : 0;
  DevBuf scratch(std::max<size_t>(floats, 1) * 4);
  float* sp = floats ? scratch.as<float>() : nullptr;
  cuda::gemm(g, nullptr, sp);
  g.c = dC2.get();
  cuda::gemm(g, nullptr, sp);
  const HostBuf got = dC.to_host(DType::F32, C0.n);
  ASSERT_EQ(got.vals(), dC2.to_host(DType::F32, C0.n).vals()) << "not bitwise repeatable";

  int64_t bad = 0;
  for (int64_t z = 0; z < c.batch; ++z)
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double sum = 0.0, mag = 0.0;
        for (int64_t p = 0; p < c.k; ++p) {
          const double a = A.get(z * sa + (c.ta ? p * lda + i : i * lda + p));
          const double b = B.get(z * sb + (c.tb ? j * ldb + p : p * ldb + j));
          sum += a * b, mag += std::fabs(a * b);
        }
        const int64_t o = z * sc + i * ldc + j;
        double ref = c.alpha * sum;
        mag *= std::fabs(c.alpha);
        if (c.beta != 0.0f) ref += c.beta * C0.get(o), mag += std::fabs(c.beta * C0.get(o));
        if (c.bias) ref += bias.get(j), mag += std::fabs(bias.get(j));
        const double tol = 0x1p-24 * std::fabs(ref) + 0x1p-50 * mag;
        if (!(std::fabs(got.get(o) - ref) <= tol) && bad++ < 5)
          ADD_FAILURE() << "C[" << z << "][" << i << "][" << j << "] = " << got.get(o) << ", float64 " << ref;
      }
  EXPECT_EQ(bad, 0);
  // Padding between rows and batch items is left as it was.
  for (int64_t z = 0; z < c.batch; ++z)
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = c.n; j < ldc; ++j)
        ASSERT_EQ(got.get(z * sc + i * ldc + j), C0.get(z * sc + i * ldc + j));
}

TEST(CudaGemmDmma, IsTheFloat64ProductRoundedOnce) {
  BT_SKIP_WITHOUT_DMMA();
  BT_SEED(seed);
  std::mt19937 gen(static_cast<uint32_t>(seed));
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const Case& base :
           {Case{1, 1, 1, ta, tb}, Case{5, 7, 3, ta, tb}, Case{128, 64, 16, ta, tb},
            Case{129, 65, 17, ta, tb}, Case{200, 130, 250, ta, tb, 1, 4}, Case{64, 40, 1100, ta, tb},
            Case{257, 9, 33, ta, tb, 3, 0, 0.5f, 0.75f}, Case{70, 66, 20, ta, tb, 2, 8, -1.5f, 0.0f, true},
            Case{100, 60, 4096, ta, tb, 2, 0, 0.5f, 1.0f}}) {
        SCOPED_TRACE(::testing::Message()
                     << "m " << base.m << " n " << base.n << " k " << base.k << " ta " << ta << " tb " << tb
                     << " batch " << base.batch << " pad " << base.pad);
        check_case(base, false, gen);
        check_case(base, true, gen);
      }
}

// Note [Split K in fp64]: few tiles over a long K ask for scratch to split K
// (a weight gradient's shape), many tiles do not (a forward's); without
// scratch the GEMM runs unsplit, with it split, and both give the float64
// product rounded once (IsTheFloat64ProductRoundedOnce, its last case).
TEST(CudaGemmDmma, SplitsKOnlyWhereTheTilesAreFew) {
  BT_SKIP_WITHOUT_DMMA();
  DevBuf buf(1 << 20);
  GemmArgs g;
  g.a = g.b = g.c = buf.get();
  g.m = 768, g.n = 768, g.k = 16384, g.trans_a = true, g.lda = 768, g.ldb = 768, g.ldc = 768;
  const size_t split = cuda::gemm_scratch_floats(g);
  EXPECT_GT(split, 0u) << "768 x 768 over K 16384: 144 tiles";
  EXPECT_EQ(split % (2 * 768 * 768), 0u) << "whole fp64 partial products";
  EXPECT_LE(split * 4, size_t{64} << 20) << "within the scratch cap";
  g.m = 16384, g.n = 3072, g.k = 768, g.trans_a = false, g.trans_b = true, g.lda = 768, g.ldc = 3072;
  EXPECT_EQ(cuda::gemm_scratch_floats(g), 0u) << "16384 x 3072: 12288 tiles";
}

/// ||C - C64|| / ||C64|| of normal data, m x n x k, as gemm() runs it now.
double error_vs_float64(int64_t m, int64_t n, int64_t k, std::mt19937& gen) {
  const HostBuf A = randn_buf(DType::F32, m * k, gen), B = randn_buf(DType::F32, k * n, gen);
  GemmArgs g;
  g.m = m, g.n = n, g.k = k, g.lda = k, g.ldb = n, g.ldc = n;
  DevBuf dA(A), dB(B), dC(static_cast<size_t>(m * n) * 4);
  g.a = dA.get(), g.b = dB.get(), g.c = dC.get();
  cuda::gemm(g, nullptr);
  std::vector<double> ref(static_cast<size_t>(m * n), 0.0);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) ref[r * n + j] += A.get(r * k + p) * B.get(p * n + j);
  return rel_error(dC.to_host(DType::F32, m * n).vals(), ref);
}

// One rounding against SGEMM's K fp32 sums: at k = 2048 the error is fp32's
// rounding alone (about 2^-25 rms relative), where SGEMM's grows with k.
TEST(CudaGemmDmma, IsCloserToFloat64ThanSgemm) {
  BT_SKIP_WITHOUT_DMMA();
  BT_SEED(seed);
  for (int64_t k : {256, 2048}) {
    double err[2];
    for (int on = 0; on < 2; ++on) {
      const DmmaSwitch sw(on == 1);
      std::mt19937 gen(static_cast<uint32_t>(seed + k));  // the same inputs for both
      err[on] = error_vs_float64(96, 80, k, gen);
    }
    std::printf("k %4lld: cuBLAS SGEMM %.3e, FP64 tensor cores %.3e\n", static_cast<long long>(k), err[0],
                err[1]);
    EXPECT_LT(err[1], 0x1p-24) << "k " << k << ": more than fp32's rounding";
    EXPECT_LT(2 * err[1], err[0]) << "k " << k << ": not closer to float64 than SGEMM";
  }
}

TEST(CudaGemmDmma, WhichGemmsTakeIt) {
  BT_SKIP_WITHOUT_DMMA();
  DevBuf buf(1 << 20);
  float* p = buf.as<float>();
  GemmArgs g;
  g.m = 16384, g.n = 3072, g.k = 768, g.trans_b = true, g.lda = 768, g.ldb = 768, g.ldc = 3072;
  g.a = p, g.b = p, g.c = p;
  EXPECT_TRUE(cuda::gemm_uses_dmma(g)) << "the forward's x W^T";
  g.trans_b = false, g.ldb = 3072;
  EXPECT_TRUE(cuda::gemm_uses_dmma(g)) << "dX = dY W";
  g.trans_a = true, g.lda = 16384;
  EXPECT_TRUE(cuda::gemm_uses_dmma(g)) << "dW = dY^T X";
  GemmArgs o = g;
  o.lda = 16385;
  EXPECT_FALSE(cuda::gemm_uses_dmma(o)) << "rows not in 16-byte chunks";
  o = g, o.a = p + 1;
  EXPECT_FALSE(cuda::gemm_uses_dmma(o)) << "a base not 16-byte aligned";
  o = g, o.batch = 2, o.stride_b = 6;
  EXPECT_FALSE(cuda::gemm_uses_dmma(o)) << "a batch stride not in whole chunks";
  o = g, o.math = GemmMath::Tf32;
  EXPECT_FALSE(cuda::gemm_uses_dmma(o)) << "TF32";
  o = g, o.math = GemmMath::Tf32x3;
  EXPECT_FALSE(cuda::gemm_uses_dmma(o)) << "3xTF32";
  o = g, o.dtype = DType::BF16;
  EXPECT_FALSE(cuda::gemm_uses_dmma(o)) << "bf16";
  const DmmaSwitch off(false);
  EXPECT_FALSE(cuda::gemm_uses_dmma(g)) << "switched off";
}

// Unaligned operands take cuBLAS's SGEMM and still give fp32 results; the
// same problem aligned takes the FP64 tensor cores; both within SGEMM's
// tolerance of the float64 product.
TEST(CudaGemmDmma, UnalignedOperandsFallBackToSgemm) {
  BT_SKIP_WITHOUT_DMMA();
  BT_SEED(seed);
  std::mt19937 gen(static_cast<uint32_t>(seed));
  const int64_t m = 33, n = 31, k = 45;
  const HostBuf A = randn_buf(DType::F32, m * k + 1, gen), B = randn_buf(DType::F32, k * n, gen);
  DevBuf dA(A), dB(B), dC(m * n * 4);
  GemmArgs g;
  g.m = m, g.n = n, g.k = k, g.lda = k, g.ldb = n, g.ldc = n;
  g.a = dA.as<float>() + 1, g.b = dB.get(), g.c = dC.get();
  EXPECT_FALSE(cuda::gemm_uses_dmma(g));
  cuda::gemm(g, nullptr);
  const HostBuf got = dC.to_host(DType::F32, m * n);
  std::vector<double> ref(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) ref[i * n + j] += A.get(1 + i * k + p) * B.get(p * n + j);
  EXPECT_LT(rel_error(got.vals(), ref), 1e-6);
}

}  // namespace
}  // namespace bt::test::gpu
