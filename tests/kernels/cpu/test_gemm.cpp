// Batched row-major GEMM with epilogues against a naive double reference;
// F32 also as 3xTF32 (GemmMath::Tf32x3, Note [3xTF32] in kernels/gemm.h):
// within fp32's tolerance in every case, about as close to float64 as strict
// SGEMM and far closer than one TF32 product, and rounding as cvt.rna does.
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/common/tf32.h"
#include "kernels/gelu.h"
#include "kernels/gemm.h"
#include "kernels/reduce.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace bt::test {
namespace {
using kernels::Epilogue;
using kernels::GemmArgs;
using kernels::GemmMath;
namespace cpu = kernels::cpu;

double gelu_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
/// d gelu_ref(x) / dx.
double gelu_grad_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI), t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

struct Case {
  int64_t m, n, k;
  bool ta, tb;
  int64_t batch = 1;
  float alpha = 1.0f, beta = 0.0f;
  Epilogue epi = Epilogue::None;
  int64_t pad = 0;        // extra columns in every leading dimension
  bool bcast_b = false;   // stride_b = 0: one B for all batch items
  bool with_pre = false;  // request pre_gelu
};

std::string describe(DType dt, const Case& c) {
  return bt::cat(dtype_name(dt), " m=", c.m, " n=", c.n, " k=", c.k, " ta=", c.ta, " tb=", c.tb,
                 " batch=", c.batch, " alpha=", c.alpha, " beta=", c.beta, " epi=", static_cast<int>(c.epi),
                 " pad=", c.pad);
}

/// `c_dt`: the dtype of C when it differs from the operands' (GemmArgs::c_dtype).
void run_case(DType dt, const Case& c, uint32_t seed, GemmMath math = GemmMath::Strict,
              std::optional<DType> c_dt = std::nullopt) {
  SCOPED_TRACE(describe(dt, c) + " math=" + std::to_string(static_cast<int>(math)) +
               (c_dt ? bt::cat(" c_dtype=", *c_dt) : std::string()));
  const DType cdt = c_dt.value_or(dt);
  const int64_t ar = c.ta ? c.k : c.m, ac = c.ta ? c.m : c.k;  // stored shape of A
  const int64_t br = c.tb ? c.n : c.k, bc = c.tb ? c.k : c.n;
  GemmArgs g;
  g.dtype = dt;
  g.trans_a = c.ta, g.trans_b = c.tb;
  g.m = c.m, g.n = c.n, g.k = c.k;
  g.alpha = c.alpha, g.beta = c.beta;
  g.lda = std::max<int64_t>(ac, 1) + c.pad;
  g.ldb = std::max<int64_t>(bc, 1) + c.pad;
  g.ldc = std::max<int64_t>(c.n, 1) + c.pad;
  g.batch = c.batch;
  g.stride_a = ar * g.lda + 3;  // gaps between batch items
  g.stride_b = c.bcast_b ? 0 : br * g.ldb + 1;
  g.stride_c = c.m * g.ldc + 2;
  g.epilogue = c.epi;
  g.math = math;
  g.c_dtype = c_dt;
  const int64_t na = std::max<int64_t>(c.batch * g.stride_a, 1),
                nb = std::max<int64_t>(c.batch * g.stride_b + br * g.ldb, 1), nc = c.batch * g.stride_c;
  Buf A = rand_buf(dt, na, seed), B = rand_buf(dt, nb, seed + 1), C = rand_buf(cdt, nc, seed + 2),
      bias = rand_buf(dt, c.n, seed + 3), pre(dt, nc);
  if (c.beta == 0.0f)  // C must not be read when beta == 0: poison it
    for (int64_t i = 0; i < nc; ++i) C.set(i, std::numeric_limits<double>::quiet_NaN());
  const std::vector<double> a = A.vals(), b = B.vals(), c0 = C.vals(), bv = bias.vals();
  g.a = A.data(), g.b = B.data(), g.c = C.data(), g.bias = bias.data();
  if (c.with_pre) g.pre_gelu = pre.data();
  cpu::gemm(g);

  const bool add_bias = c.epi == Epilogue::Bias || c.epi == Epilogue::BiasGelu;
  const bool gelu = c.epi == Epilogue::Gelu || c.epi == Epilogue::BiasGelu;
  std::vector<double> got, ref, got_pre, ref_pre;
  for (int64_t bi = 0; bi < c.batch; ++bi)
    for (int64_t r = 0; r < c.m; ++r)
      for (int64_t j = 0; j < c.n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < c.k; ++p) {
          const double x = a[bi * g.stride_a + (c.ta ? p * g.lda + r : r * g.lda + p)];
          const double y = b[bi * g.stride_b + (c.tb ? j * g.ldb + p : p * g.ldb + j)];
          acc += x * y;
        }
        const int64_t ci = bi * g.stride_c + r * g.ldc + j;
        double v = c.alpha * acc + (c.beta != 0.0f ? c.beta * c0[ci] : 0.0);
        if (add_bias) v += bv[j];
        if (gelu && c.with_pre) ref_pre.push_back(v), got_pre.push_back(pre.get(ci));
        if (gelu) v = gelu_ref(v);
        ref.push_back(v);
        got.push_back(C.get(ci));
      }
  EXPECT_LT(rel_err(got, ref), tol(cdt));  // an f32 C of bf16 operands: f32's tolerance
  if (gelu && c.with_pre) {
    EXPECT_LT(rel_err(got_pre, ref_pre), tol(dt));
  }
  // Padding and the gaps between batch items are untouched.
  for (int64_t bi = 0; bi < c.batch; ++bi)
    for (int64_t r = 0; r < c.m; ++r)
      for (int64_t j = c.n; j < g.ldc; ++j) {
        const int64_t ci = bi * g.stride_c + r * g.ldc + j;
        if (std::isnan(c0[ci])) {
          EXPECT_TRUE(std::isnan(C.get(ci)));
        } else {
          EXPECT_EQ(C.get(ci), c0[ci]);
        }
      }
}

TEST(GemmCpu, ShapesAndTransposes) {
  const int64_t shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 9}, {33, 17, 64}, {1, 33, 17}, {64, 48, 300}};
  uint32_t seed = 1;
  for (DType dt : kFloatTypes)
    for (auto& s : shapes)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) run_case(dt, Case{s[0], s[1], s[2], ta, tb}, seed += 4);
}

TEST(GemmCpu, AlphaBetaPaddingBatch) {
  uint32_t seed = 1000;
  for (DType dt : kFloatTypes) {
    run_case(dt, Case{5, 7, 3, false, false, 1, 0.5f, 0.0f}, seed += 4);
    run_case(dt, Case{5, 7, 3, false, true, 1, 1.0f, 1.0f}, seed += 4);
    run_case(dt, Case{17, 3, 33, true, false, 1, -2.0f, 0.25f, Epilogue::None, 5}, seed += 4);
    run_case(dt, Case{9, 11, 13, false, false, 4, 1.0f, 0.0f, Epilogue::None, 2}, seed += 4);
    run_case(dt, Case{9, 11, 13, true, true, 3, 0.75f, -1.0f, Epilogue::None, 1, true}, seed += 4);
    run_case(dt, Case{4, 6, 0, false, false, 2, 1.0f, 0.5f}, seed += 4);  // k = 0: C = beta C
    run_case(dt, Case{4, 6, 0, false, true, 1, 1.0f, 0.0f}, seed += 4);   // k = 0, beta = 0: zeros
  }
}

TEST(GemmCpu, Epilogues) {
  uint32_t seed = 2000;
  for (DType dt : kFloatTypes)
    for (bool ta : {false, true}) {
      run_case(dt, Case{7, 17, 33, ta, false, 1, 1.0f, 0.0f, Epilogue::Bias}, seed += 4);
      run_case(dt, Case{7, 17, 33, ta, true, 2, 0.5f, 0.0f, Epilogue::Bias, 3}, seed += 4);
      for (bool pre : {false, true}) {
        run_case(dt, Case{7, 17, 33, ta, false, 1, 1.0f, 0.0f, Epilogue::Gelu, 0, false, pre}, seed += 4);
        run_case(dt, Case{7, 17, 33, ta, true, 1, 0.5f, 1.0f, Epilogue::Gelu, 2, false, pre}, seed += 4);
        run_case(dt, Case{3, 33, 17, ta, false, 3, 1.0f, 0.0f, Epilogue::BiasGelu, 1, true, pre}, seed += 4);
        run_case(dt, Case{3, 33, 17, ta, true, 1, 2.0f, 0.5f, Epilogue::BiasGelu, 0, false, pre}, seed += 4);
      }
    }
}

// BF16 A and B into an F32 C, written (beta = 0) or accumulated into (beta =
// 1, as a gradient adds into a leaf's f32 .grad). The reference is exact on
// the bf16 values, so the f32 tolerance holds: a result rounded through bf16
// (relative error ~2^-9) fails it.
TEST(GemmCpu, Bf16OperandsIntoF32) {
  uint32_t seed = 3000;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        run_case(DType::BF16, Case{17, 33, 64, ta, tb, 1, 1.0f, beta}, seed += 4, GemmMath::Strict,
                 DType::F32);
        run_case(DType::BF16, Case{9, 11, 13, ta, tb, 3, 0.5f, beta, Epilogue::None, 2}, seed += 4,
                 GemmMath::Strict, DType::F32);
      }
  run_case(DType::BF16, Case{5, 7, 0, false, false, 2, 1.0f, 1.0f}, seed += 4, GemmMath::Strict,
           DType::F32);  // k = 0: C = C
  run_case(DType::BF16, Case{5, 7, 0, false, false, 1, 1.0f, 0.0f}, seed += 4, GemmMath::Strict,
           DType::F32);  // k = 0: zeros
  run_case(DType::F32, Case{5, 7, 3, false, false}, seed += 4, GemmMath::Strict,
           DType::F32);  // c_dtype == dtype: as unset
}

// Note [Fused bias gradient]: bias_grad is sum over k of op(A) -- dY's column
// sums when A = dY^T -- against a double reference, in C's dtype (f32 for
// bf16 operands), and asking for it leaves C's bits as they were.
TEST(GemmCpu, BiasGradIsTheSumOfOpAOverK) {
  uint32_t seed = 5000;
  for (DType dt : {DType::F32, DType::BF16})
    for (bool ta : {true, false})
      for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{37}, int64_t{300}}) {
        const int64_t m = 19, n = 7;
        SCOPED_TRACE(bt::cat(dtype_name(dt), " ta=", ta, " k=", k));
        const DType cdt = DType::F32;
        const Buf A = rand_buf(dt, std::max<int64_t>(m * k, 1), seed++),
                  B = rand_buf(dt, std::max<int64_t>(k * n, 1), seed++);
        GemmArgs g;
        g.dtype = dt;
        if (dt == DType::BF16) g.c_dtype = cdt;
        g.m = m, g.n = n, g.k = k, g.trans_a = ta;
        g.lda = ta ? m : k, g.ldb = n, g.ldc = n;
        g.a = A.data(), g.b = B.data();
        Buf C(cdt, m * n), C_plain(cdt, m * n), db(cdt, m);
        g.c = C_plain.data();
        cpu::gemm(g);
        g.c = C.data();
        g.bias_grad = db.data();
        cpu::gemm(g);
        EXPECT_EQ(C.bytes, C_plain.bytes) << "bias_grad changed C";
        std::vector<double> ref(m, 0.0), got(m);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t p = 0; p < k; ++p) ref[i] += A.get(ta ? p * m + i : i * k + p);
          got[i] = db.get(i);
        }
        if (k == 0)
          EXPECT_EQ(got, ref);
        else
          EXPECT_LT(rel_err(got, ref), tol(cdt));
      }
}

// Note [GELU-gradient epilogue]: DGelu multiplies the product by gelu' at
// gelu_in (read with its own leading dimension), DGeluBgrad also sums the
// stored C's columns into bias_grad (f32 for bf16), against a double
// reference in every dtype, f32 also as 3xTF32, both transposes, k = 0
// included. In strict f32 the bits are those of the plain GEMM, then the
// gelu_backward kernel and the reduction.
TEST(GemmCpu, DGeluIsTheGeluGradientOfTheProduct) {
  uint32_t seed = 6000;
  for (DType dt : kFloatTypes)
    for (GemmMath math : {GemmMath::Strict, GemmMath::Tf32x3})
      for (bool bgrad : {false, true})
        for (bool ta : {false, true})
          for (bool tb : {false, true})
            for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{37}}) {
              if (math == GemmMath::Tf32x3 && dt != DType::F32) continue;
              const int64_t m = 13, n = 11, ldc = bgrad ? n : n + 2, ldp = n + 5;
              SCOPED_TRACE(bt::cat(dtype_name(dt), " math=", static_cast<int>(math), " bgrad=", bgrad,
                                   " ta=", ta, " tb=", tb, " k=", k));
              const DType bdt = dt == DType::BF16 ? DType::F32 : dt;
              const Buf A = rand_buf(dt, std::max<int64_t>(m * k, 1), seed++),
                        B = rand_buf(dt, std::max<int64_t>(k * n, 1), seed++),
                        P = rand_buf(dt, m * ldp, seed++, 2.0);
              Buf C(dt, m * ldc), db(bdt, n);
              GemmArgs g;
              g.dtype = dt, g.math = math;
              g.m = m, g.n = n, g.k = k, g.trans_a = ta, g.trans_b = tb;
              g.lda = std::max<int64_t>(ta ? m : k, 1), g.ldb = std::max<int64_t>(tb ? k : n, 1), g.ldc = ldc;
              g.alpha = 0.75f;
              g.a = A.data(), g.b = B.data(), g.c = C.data();
              g.epilogue = bgrad ? Epilogue::DGeluBgrad : Epilogue::DGelu;
              g.gelu_in = P.data(), g.ld_gelu_in = ldp;
              if (bgrad) g.bias_grad = db.data(), g.bias_grad_dtype = bdt;
              cpu::gemm(g);
              std::vector<double> got, ref, db_ref(n, 0.0);
              for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j) {
                  double acc = 0;
                  for (int64_t p = 0; p < k; ++p)
                    acc += A.get(ta ? p * m + i : i * k + p) * B.get(tb ? j * k + p : p * n + j);
                  ref.push_back(g.alpha * acc * gelu_grad_ref(P.get(i * ldp + j)));
                  got.push_back(C.get(i * ldc + j));
                  db_ref[j] += got.back();
                }
              EXPECT_LT(rel_err(got, ref), tol(dt));
              if (bgrad) {
                EXPECT_LT(rel_err(db.vals(), db_ref), tol(bdt)) << "bias_grad";
              }
              if (dt != DType::F32 || math != GemmMath::Strict) continue;
              // The unfused ops, row by row (C and gelu_in have their own lds).
              Buf C2(dt, m * ldc), db2(bdt, n);
              GemmArgs plain = g;
              plain.epilogue = Epilogue::None, plain.gelu_in = nullptr, plain.bias_grad = nullptr;
              plain.c = C2.data();
              cpu::gemm(plain);
              const float* pre = reinterpret_cast<const float*>(P.data());
              float* c2 = reinterpret_cast<float*>(C2.data());
              for (int64_t i = 0; i < m; ++i)
                kernels::cpu::gelu_backward(dt, pre + i * ldp, c2 + i * ldc, c2 + i * ldc, n);
              EXPECT_EQ(C.bytes, C2.bytes) << "C differs from the GEMM, then gelu_backward";
              if (!bgrad) continue;
              kernels::cpu::reduce_dim(kernels::ReduceOp::Sum, dt, bdt, C.data(), db2.data(), 1, m, n);
              EXPECT_EQ(db.bytes, db2.bytes) << "bias_grad differs from the reduction";
            }
  // No rows: a zero bias gradient.
  std::vector<float> db(3, 7.0f), in(1);
  GemmArgs g;
  g.m = 0, g.n = 3, g.k = 2, g.lda = 2, g.ldb = 3, g.ldc = 3, g.ld_gelu_in = 3;
  g.a = g.b = g.gelu_in = in.data(), g.c = in.data(), g.bias_grad = db.data();
  g.epilogue = Epilogue::DGeluBgrad;
  cpu::gemm(g);
  EXPECT_EQ(db, std::vector<float>(3, 0.0f));
}

TEST(GemmCpu, Errors) {
  std::vector<float> buf(64, 1.0f);
  GemmArgs g;
  g.m = g.n = g.k = 2;
  g.lda = g.ldb = g.ldc = 2;
  g.a = g.b = g.bias = buf.data();
  g.c = buf.data() + 32;
  g.epilogue = Epilogue::Bias;
  g.beta = 1.0f;
  expect_error([&] { cpu::gemm(g); }, "beta");
  EXPECT_THROW(cpu::gemm(g), Error);
  g.epilogue = Epilogue::None;
  g.beta = 0.0f;
  g.dtype = DType::F16;
  expect_error([&] { cpu::gemm(g); }, "gemm: unsupported dtype f16");
  g.dtype = DType::F32;
  g.lda = 1;
  expect_error([&] { cpu::gemm(g); }, "lda");
  g.lda = 2;
  g.epilogue = Epilogue::BiasGelu;
  g.bias = nullptr;
  expect_error([&] { cpu::gemm(g); }, "bias");
  // Mixed dtypes: only bf16 A and B into an f32 C, with no epilogue.
  g.bias = buf.data();
  g.dtype = DType::BF16;
  g.c_dtype = DType::F32;
  expect_error([&] { cpu::gemm(g); }, "gemm: a bf16 GEMM into an f32 C takes no epilogue");
  g.epilogue = Epilogue::Bias;
  g.beta = 0.0f;
  expect_error([&] { cpu::gemm(g); }, "takes no epilogue");
  g.epilogue = Epilogue::None;
  g.dtype = DType::F32;
  g.c_dtype = DType::F64;
  expect_error([&] { cpu::gemm(g); }, "gemm: f32 into f64 is not supported");
  g.c_dtype = DType::BF16;  // narrower: not supported either
  expect_error([&] { cpu::gemm(g); }, "not supported");
  // bias_grad: no epilogue, one batch item, no padding in A.
  g.c_dtype.reset();
  g.bias_grad = buf.data() + 48;
  g.epilogue = Epilogue::Bias;
  expect_error([&] { cpu::gemm(g); },
               "gemm: bias_grad needs Epilogue::None or DGeluBgrad, and one batch item");
  g.epilogue = Epilogue::None;
  g.batch = 2;
  g.stride_a = g.stride_b = g.stride_c = 4;
  expect_error([&] { cpu::gemm(g); }, "one batch item");
  g.batch = 1;
  g.lda = 3;
  expect_error([&] { cpu::gemm(g); }, "gemm: bias_grad needs an A without padding (lda 3, expected 2)");
  // The GELU-gradient epilogues: beta 0, one batch item, gelu_in with its ld,
  // and for DGeluBgrad bias_grad over a C without padding.
  g.lda = 2;
  g.bias_grad = nullptr;
  g.epilogue = Epilogue::DGelu;
  g.batch = 2;
  expect_error([&] { cpu::gemm(g); }, "gemm: the DGelu epilogues need beta == 0 and one batch item");
  g.batch = 1;
  g.gelu_in = buf.data() + 40;
  g.ld_gelu_in = 1;
  expect_error([&] { cpu::gemm(g); }, "gemm: ld_gelu_in 1 is smaller than n = 2");
  g.ld_gelu_in = 2;
  g.beta = 1.0f;
  expect_error([&] { cpu::gemm(g); }, "beta == 0");
  g.beta = 0.0f;
  g.gelu_in = nullptr;
  expect_error([&] { cpu::gemm(g); }, "gemm: the DGelu epilogues need gelu_in");
  g.gelu_in = buf.data() + 40;
  g.epilogue = Epilogue::DGeluBgrad;
  expect_error([&] { cpu::gemm(g); }, "gemm: DGeluBgrad needs bias_grad (use DGelu for no bias gradient)");
  g.bias_grad = buf.data() + 48;
  g.ldc = 3;
  expect_error([&] { cpu::gemm(g); }, "gemm: DGeluBgrad needs a C without padding (ldc 3, expected 2)");
  g.ldc = 2;
  g.bias_grad_dtype = DType::F64;
  expect_error([&] { cpu::gemm(g); }, "gemm: f32 into f64 is not supported");
}

}  // namespace
}  // namespace bt::test

namespace bt::test {
namespace {

// Every case above, in F32 as 3xTF32, within fp32's tolerance.
TEST(GemmCpu, Tf32x3PassesEveryCaseAtFp32Tolerance) {
  uint32_t seed = 3000;
  const int64_t shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 9}, {33, 17, 64}, {1, 33, 17}, {64, 48, 300}};
  for (auto& s : shapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        run_case(DType::F32, Case{s[0], s[1], s[2], ta, tb}, seed += 4, GemmMath::Tf32x3);
  const Case more[] = {
      {5, 7, 3, false, true, 1, 1.0f, 1.0f},
      {17, 3, 33, true, false, 1, -2.0f, 0.25f, Epilogue::None, 5},
      {9, 11, 13, false, false, 4, 1.0f, 0.0f, Epilogue::None, 2},
      {9, 11, 13, true, true, 3, 0.75f, -1.0f, Epilogue::None, 1, true},
      {4, 6, 0, false, false, 2, 1.0f, 0.5f},
      {7, 17, 33, true, true, 2, 0.5f, 0.0f, Epilogue::Bias, 3},
      {7, 17, 33, false, true, 1, 0.5f, 1.0f, Epilogue::Gelu, 2, false, true},
      {3, 33, 17, true, false, 3, 1.0f, 0.0f, Epilogue::BiasGelu, 1, true, true},
  };
  for (const Case& c : more) run_case(DType::F32, c, seed += 4, GemmMath::Tf32x3);
}

/// ||C - C64|| / ||C64|| of an m x n x k F32 GEMM of normal data, where C64 is
/// the float64 product of the same f32 inputs; with `round_inputs`, A and B are
/// first rounded to TF32 (one TF32 product, emulated).
double error_vs_float64(int64_t m, int64_t n, int64_t k, GemmMath math, bool round_inputs, uint32_t seed) {
  Buf A = rand_buf(DType::F32, static_cast<size_t>(m * k), seed),
      B = rand_buf(DType::F32, static_cast<size_t>(k * n), seed + 1), C(DType::F32, m * n);
  const std::vector<double> a = A.vals(), b = B.vals();
  if (round_inputs) {
    for (int64_t i = 0; i < A.n; ++i) A.set(i, kernels::round_to_tf32(static_cast<float>(a[i])));
    for (int64_t i = 0; i < B.n; ++i) B.set(i, kernels::round_to_tf32(static_cast<float>(b[i])));
  }
  GemmArgs g;
  g.m = m, g.n = n, g.k = k;
  g.lda = k, g.ldb = n, g.ldc = n;
  g.a = A.data(), g.b = B.data(), g.c = C.data();
  g.math = math;
  cpu::gemm(g);
  std::vector<double> ref(static_cast<size_t>(m * n), 0.0);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) ref[r * n + j] += a[r * k + p] * b[p * n + j];
  return rel_err(C.vals(), ref);
}

// Note [3xTF32]: against the float64 product, 3xTF32 is about as close as
// strict SGEMM and far closer than one TF32 product. Its extra error, at most
// 2^-22 of each operand at worst, and of random sign, added less than 0.17 x
// 2^-22 to SGEMM's relative error on this data (100 seeds, k 16 to 2048),
// while one TF32 product was at least 977 times worse than 3xTF32. Both bounds
// fail if the compensation goes (3xTF32 is then one TF32 product) or a cross
// product is dropped (an error of ~2^-12).
TEST(GemmCpu, Tf32x3IsAsCloseToFloat64AsSgemm) {
  uint32_t seed = 4000;
  for (int64_t k : {16, 256, 2048}) {
    SCOPED_TRACE(::testing::Message() << "k " << k);
    const int64_t m = 48, n = 40;
    const double strict = error_vs_float64(m, n, k, GemmMath::Strict, false, seed);
    const double x3 = error_vs_float64(m, n, k, GemmMath::Tf32x3, false, seed);
    const double tf32 = error_vs_float64(m, n, k, GemmMath::Strict, true, seed);
    std::printf("k %4lld: strict %.3e, 3xtf32 %.3e, tf32 %.3e\n", static_cast<long long>(k), strict, x3,
                tf32);
    EXPECT_LT(x3, strict + 0x1p-23) << "3xTF32 is not about as accurate as SGEMM";
    EXPECT_GT(tf32, 256 * x3) << "3xTF32 is not far more accurate than one TF32 product";
    seed += 2;
  }
}

// A = 4099 (13 significant bits), B = 1024.5 (12): exact sums that tell the
// roundings apart. Round to nearest, ties away (cvt.rna): 4100 - 1 and
// 1025 - 0.5, so C = 4100 * 1025 - 4100 * 0.5 - 1 * 1025 = 4199425 (the
// dropped small product is +0.5). Ties to even would give 4199426, truncation
// 4199424, strict fp32 the exact 4199425.5, one TF32 product 4202500.
TEST(GemmCpu, Tf32x3RoundsToNearestTiesAway) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "ta " << ta << " tb " << tb);
      // k = 3: the value sits in the middle of K, the rest of A and B is zero.
      std::vector<float> A(6, 0.0f), B(3, 0.0f), C(2, -1.0f);
      A[ta ? 1 * 2 + 1 : 1 * 3 + 1] = 4099.0f;  // op(A) 2 x 3, element (1, 1)
      B[1] = 1024.5f;                           // op(B) 3 x 1, element (1, 0) either way
      GemmArgs g;
      g.trans_a = ta, g.trans_b = tb;
      g.m = 2, g.n = 1, g.k = 3;
      g.lda = ta ? 2 : 3, g.ldb = tb ? 3 : 1, g.ldc = 1;
      g.a = A.data(), g.b = B.data(), g.c = C.data();
      g.math = GemmMath::Tf32x3;
      cpu::gemm(g);
      EXPECT_EQ(C[0], 0.0f);
      EXPECT_EQ(C[1], 4199425.0f);
      g.math = GemmMath::Strict;
      cpu::gemm(g);
      EXPECT_EQ(C[1], 4199425.5f);
    }
}

}  // namespace
}  // namespace bt::test
