// GPU GEMM (cuBLASLt) against the CPU GEMM: transposes, leading-dimension
// padding, alpha/beta, batches (including a broadcast B), and the bias / GELU /
// bias+GELU epilogues with the pre-GELU aux output; f32, f32+tf32 and bf16.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/gemm.h"
#include "tests/kernels/cuda/gpu_test_util.h"

namespace bt::test::gpu {
namespace {
namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;
using kernels::Epilogue;
using kernels::GemmArgs;

struct Case {
  int64_t m, n, k;
  bool ta = false, tb = false;
  int64_t batch = 1;
  float alpha = 1.0f, beta = 0.0f;
  Epilogue epi = Epilogue::None;
  int64_t pad = 0;        // extra columns in every leading dimension
  bool bcast_b = false;   // stride_b = 0
  bool with_pre = false;  // request pre_gelu
};

struct Precision {
  DType dt;
  bool tf32;
  double tol;
  const char* name;
};

std::string describe(const Precision& p, const Case& c) {
  return bt::cat(p.name, " m=", c.m, " n=", c.n, " k=", c.k, " ta=", c.ta, " tb=", c.tb, " batch=", c.batch,
                 " alpha=", c.alpha, " beta=", c.beta, " epi=", static_cast<int>(c.epi), " pad=", c.pad,
                 " bcast_b=", c.bcast_b, " pre=", c.with_pre);
}

/// Values of the m x n block of every batch item of a [batch] x rows x ld buffer.
std::vector<double> block(const HostBuf& h, int64_t batch, int64_t stride, int64_t rows, int64_t cols,
                          int64_t ld) {
  std::vector<double> v;
  v.reserve(static_cast<size_t>(batch * rows * cols));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) v.push_back(h.get(b * stride + r * ld + j));
  return v;
}

void run_case(const Precision& p, const Case& c, std::mt19937& gen) {
  SCOPED_TRACE(describe(p, c));
  const DType dt = p.dt;
  const int64_t ar = c.ta ? c.k : c.m, ac = c.ta ? c.m : c.k;  // stored shape of A
  const int64_t br = c.tb ? c.n : c.k, bc = c.tb ? c.k : c.n;  // stored shape of B
  const int64_t lda = std::max<int64_t>(ac, 1) + c.pad, ldb = std::max<int64_t>(bc, 1) + c.pad,
                ldc = std::max<int64_t>(c.n, 1) + c.pad;
  const int64_t sa = ar * lda + (c.batch > 1 ? 5 : 0), sb = c.bcast_b ? 0 : br * ldb + (c.batch > 1 ? 3 : 0),
                sc = c.m * ldc + (c.batch > 1 ? 8 : 0);
  const int64_t na = std::max<int64_t>((c.batch - 1) * sa + ar * lda, 1);
  const int64_t nb = std::max<int64_t>((c.batch - 1) * sb + br * ldb, 1);
  const int64_t nc = (c.batch - 1) * sc + c.m * ldc;
  const HostBuf A = random_buf(dt, na, gen), B = random_buf(dt, nb, gen), C0 = random_buf(dt, nc, gen);
  const HostBuf bias = random_buf(dt, std::max<int64_t>(c.n, 1), gen);
  const bool gelu = c.epi == Epilogue::Gelu || c.epi == Epilogue::BiasGelu;
  const bool use_bias = c.epi == Epilogue::Bias || c.epi == Epilogue::BiasGelu;

  GemmArgs g;
  g.dtype = dt;
  g.trans_a = c.ta;
  g.trans_b = c.tb;
  g.m = c.m, g.n = c.n, g.k = c.k;
  g.alpha = c.alpha, g.beta = c.beta;
  g.lda = lda, g.ldb = ldb, g.ldc = ldc;
  g.batch = c.batch;
  g.stride_a = sa, g.stride_b = sb, g.stride_c = sc;
  g.epilogue = c.epi;
  g.allow_tf32 = p.tf32;

  // CPU reference.
  HostBuf C_ref = C0, P_ref(dt, nc);
  GemmArgs gc = g;
  gc.a = A.data();
  gc.b = B.data();
  gc.c = C_ref.data();
  gc.bias = use_bias ? bias.data() : nullptr;
  gc.pre_gelu = c.with_pre ? P_ref.data() : nullptr;
  cpu::gemm(gc);

  // GPU: C is poisoned when beta == 0 (it must not be read), else holds C0.
  DevBuf dA(A), dB(B), dBias(bias), dC(C0), dP(static_cast<size_t>(nc) * dtype_size(dt));
  if (c.beta == 0.0f) dC.poison();
  dP.poison();
  GemmArgs gg = g;
  gg.a = dA.get();
  gg.b = dB.get();
  gg.c = dC.get();
  gg.bias = use_bias ? dBias.get() : nullptr;
  gg.pre_gelu = c.with_pre ? dP.get() : nullptr;
  cuda::gemm(gg, nullptr);
  // Run twice: the second call takes the cached plan (and must give the same result).
  if (c.beta == 0.0f) cuda::gemm(gg, nullptr);

  const HostBuf C_out = dC.to_host(dt, nc);
  BT_EXPECT_REL(block(C_out, c.batch, sc, c.m, c.n, ldc), block(C_ref, c.batch, sc, c.m, c.n, ldc), p.tol,
                "C");
  if (c.with_pre && gelu) {
    const HostBuf P_out = dP.to_host(dt, nc);
    BT_EXPECT_REL(block(P_out, c.batch, sc, c.m, c.n, ldc), block(P_ref, c.batch, sc, c.m, c.n, ldc), p.tol,
                  "pre_gelu");
  }
}

const std::vector<Case>& cases() {
  static const std::vector<Case> cs = [] {
    std::vector<Case> v;
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        v.push_back({7, 31, 5, ta, tb});
        v.push_back({129, 65, 33, ta, tb});
        Case b{17, 9, 13, ta, tb, 4};
        v.push_back(b);
      }
    v.push_back({1, 1, 1});
    v.push_back({256, 256, 256});
    v.push_back({100, 300, 77, false, false, 1, 0.5f, 0.7f});
    v.push_back({64, 96, 80, false, false, 1, 1.0f, 0.0f, Epilogue::Bias});
    v.push_back({33, 17, 9, false, false, 1, 1.0f, 0.0f, Epilogue::Gelu});
    v.push_back({64, 128, 64, false, false, 1, 1.0f, 0.0f, Epilogue::BiasGelu, 0, false, true});
    v.push_back({64, 128, 64, false, true, 1, 1.0f, 0.0f, Epilogue::BiasGelu, 0, false, false});
    v.push_back(
        {31, 33, 7, true, false, 1, 1.0f, 0.0f, Epilogue::BiasGelu, 3, false, true});  // aux ld % 8 != 0
    v.push_back({48, 64, 32, false, false, 3, 1.0f, 0.0f, Epilogue::Gelu, 0, false, true});
    v.push_back({40, 24, 16, true, true, 2, 1.0f, 0.0f, Epilogue::BiasGelu, 8, false, true});
    v.push_back({16, 32, 8, false, false, 3, 1.0f, 0.0f, Epilogue::None, 0, true});
    v.push_back({20, 24, 16, false, false, 1, 1.0f, 0.5f, Epilogue::Gelu});
    v.push_back({20, 24, 16, false, false, 2, 2.0f, 0.25f, Epilogue::None, 1});
    v.push_back({5, 7, 0, false, false, 1, 1.0f, 0.5f});                                      // k = 0
    v.push_back({5, 7, 0, false, false, 1, 1.0f, 0.0f, Epilogue::BiasGelu, 0, false, true});  // k = 0
    return v;
  }();
  return cs;
}

TEST(CudaGemm, MatchesCpu) {
  BT_SKIP_WITHOUT_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  const Precision precisions[] = {{DType::F32, false, 1e-5, "f32"},
                                  {DType::F32, true, 5e-3, "f32+tf32"},
                                  {DType::BF16, false, 1e-2, "bf16"}};
  for (const Precision& p : precisions)
    for (const Case& c : cases()) run_case(p, c, gen);
}

TEST(CudaGemm, ReferenceGemmMatchesCpu) {
  BT_SKIP_WITHOUT_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  const Precision precisions[] = {{DType::F32, false, 1e-5, "f32"},
                                  {DType::F32, true, 5e-3, "f32+tf32"},
                                  {DType::BF16, false, 1e-2, "bf16"}};
  for (const Precision& p : precisions) {
    for (bool ta : {false, true}) {
      for (int64_t batch : {1, 3}) {
        const int64_t m = 65, n = 33, k = 47;
        SCOPED_TRACE(::testing::Message() << p.name << " ta " << ta << " batch " << batch);
        const int64_t lda = ta ? m : k, ldb = n, ldc = n;
        const int64_t sa = m * k, sb = k * n, sc = m * n;
        const HostBuf A = random_buf(p.dt, batch * sa, gen), B = random_buf(p.dt, batch * sb, gen);
        GemmArgs g;
        g.dtype = p.dt;
        g.trans_a = ta;
        g.m = m, g.n = n, g.k = k;
        g.lda = lda, g.ldb = ldb, g.ldc = ldc;
        g.batch = batch;
        g.stride_a = sa, g.stride_b = sb, g.stride_c = sc;
        g.allow_tf32 = p.tf32;
        HostBuf C_ref(p.dt, batch * sc);
        GemmArgs gc = g;
        gc.a = A.data(), gc.b = B.data(), gc.c = C_ref.data();
        cpu::gemm(gc);
        DevBuf dA(A), dB(B), dC(C_ref.size_bytes());
        dC.poison();
        GemmArgs gg = g;
        gg.a = dA.get(), gg.b = dB.get(), gg.c = dC.get();
        cuda::cublas_reference_gemm(gg, nullptr);
        BT_EXPECT_REL(dC.to_host(p.dt, batch * sc).vals(), C_ref.vals(), p.tol, "reference C");
      }
    }
  }
}

TEST(CudaGemm, RejectsBadArguments) {
  BT_SKIP_WITHOUT_GPU();
  DevBuf d(1024);
  GemmArgs g;
  g.m = g.n = g.k = 4;
  g.lda = g.ldb = g.ldc = 4;
  g.a = g.b = g.c = d.get();
  g.dtype = DType::F64;
  EXPECT_THROW(cuda::gemm(g, nullptr), bt::Error);
  g.dtype = DType::F32;
  g.lda = 3;
  EXPECT_THROW(cuda::gemm(g, nullptr), bt::Error);
  g.lda = 4;
  g.epilogue = Epilogue::Bias;
  EXPECT_THROW(cuda::gemm(g, nullptr), bt::Error);  // no bias pointer
  g.bias = d.get();
  g.beta = 1.0f;
  EXPECT_THROW(cuda::gemm(g, nullptr), bt::Error);  // Bias needs beta == 0
}

}  // namespace
}  // namespace bt::test::gpu
