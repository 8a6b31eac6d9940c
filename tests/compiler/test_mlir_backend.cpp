// The MLIR fusion backend on the CPU (compiler/mlir_backend.h): every fusion
// pattern compiled through MLIR 19 and the JIT, against the same group run
// through the eager ops (fusion::run_eager) on random inputs -- f32 within
// 1e-6 relative, f64 within 1e-12, bf16 within its rounding: elementwise
// chains with broadcasting, row and column reductions, max, casts, the
// AdamW + clipping chain, strided inputs, a 0-d result; the cast to bf16
// bit for bit at its edges (NaNs, infinities, ties); and the backend's
// dumps, its answer for CUDA without a driver, and its installation.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compiler/mlir_backend.h"
#include "kernels/common/dtype.h"
#include "runtime/compile/fusion_backend.h"
#include "runtime/core/device.h"
#include "runtime/tensor/factory.h"
#include "tests/support/error_message.h"
#include "tests/support/fusion_groups.h"

namespace bt {
namespace {

using fusion::Group;
using fusion::Op;

double tol(DType dt) { return dt == DType::F64 ? 1e-12 : dt == DType::F32 ? 1e-6 : 1e-2; }

/// ||a - b|| / ||b|| over all elements, in double.
double rel_error(const Tensor& a, const Tensor& b) { return fusion::relative_difference(a, b); }

/// Compiles `g`, runs it on `inputs` into fresh outputs, and compares each
/// output with run_eager's within the dtype's tolerance. Returns the outputs.
std::vector<Tensor> expect_matches_eager(const Group& g, const std::vector<Tensor>& inputs) {
  SCOPED_TRACE("fusion group '" + g.name + "'");
  const std::shared_ptr<fusion::Backend> b = compiler::make_mlir_backend();
  EXPECT_TRUE(b != nullptr);
  if (!b) return {};
  const std::shared_ptr<fusion::Kernel> k = b->compile(g, Device::cpu());
  std::vector<Tensor> out;
  for (int o : g.outputs) {
    out.push_back(empty(g.nodes[o].shape, TensorOptions{g.nodes[o].dtype}));
    out.back().fill_(std::nan(""));  // every element must be written
  }
  k->run(inputs, out);
  const std::vector<Tensor> want = fusion::run_eager(g, inputs);
  for (size_t i = 0; i < out.size(); ++i) {
    const double err = rel_error(out[i], want[i]);
    EXPECT_LT(err, tol(out[i].dtype())) << "output " << i << " (" << dtype_name(out[i].dtype()) << ")";
  }
  return out;
}

TEST(MlirBackend, ElementwiseChainsWithBroadcasting) {
  std::mt19937 gen(1);
  for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    expect_matches_eager(test::bias_gelu_group(dt, 37, 129),
                         {test::uniform_cpu({37, 129}, dt, gen), test::uniform_cpu({129}, dt, gen)});
  }
  // Broadcasting both ways ([R, 1] against [C]), every unary op, pow, a scalar on the left.
  Group g;
  g.name = "outer";
  const int a = g.input(DType::F32, {6, 1}), b = g.input(DType::F32, {9});
  const int s = g.binary(Op::Sub, g.scalar(3.0, DType::F32), g.binary(Op::Mul, a, b));  // in (1, 5)
  const int u = g.unary(Op::Log, g.unary(Op::Sqrt, g.unary(Op::Exp, g.unary(Op::Neg, s))));
  g.output(g.binary(Op::Pow, g.binary(Op::Div, s, g.scalar(7.0, DType::F32)), u));
  expect_matches_eager(g, {test::uniform_cpu({6, 1}, DType::F32, gen, 0.1f, 1.0f),
                           test::uniform_cpu({9}, DType::F32, gen, 0.1f, 1.0f)});
}

TEST(MlirBackend, RowReductionsLayerNormFromPrimitives) {
  std::mt19937 gen(2);
  for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    expect_matches_eager(test::layer_norm_group(dt, 24, 768),
                         {test::uniform_cpu({24, 768}, dt, gen), test::uniform_cpu({768}, dt, gen),
                          test::uniform_cpu({768}, dt, gen)});
  }
}

TEST(MlirBackend, RowSumsFollowTheEagerOrderBitForBit) {
  // Note [Row sums in the eager order]: 8 partial sums, chunks of 4096 added
  // in f64, the tail in order -- every length class, trailing size-1 dims, and
  // a bf16 sum in f32. Column sums are in order on both sides already.
  std::mt19937 gen(10);
  for (DType dt : {DType::F32, DType::F64, DType::BF16})
    for (int64_t len : {1, 5, 8, 37, 4096, 4097, 8192, 10001}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " length " << len);
      Group g;
      g.name = "row_sum";
      const int x = g.input(dt, {3, len, 1});
      g.output(g.reduce(Op::Sum, x, {1}, true));
      g.output(g.reduce(Op::Sum, g.reduce(Op::Sum, x, {2}), {1}));
      const Tensor xv = test::uniform_cpu({3, len, 1}, dt, gen);
      const std::vector<Tensor> out = expect_matches_eager(g, {xv});
      const std::vector<Tensor> want = fusion::run_eager(g, {xv});
      for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(rel_error(out[i], want[i]), 0.0) << "output " << i;
    }
}

TEST(MlirBackend, ColumnReductionsBiasAndWeightGradients) {
  std::mt19937 gen(3);
  for (DType dt : {DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(dt));
    // The bias gradient (dY summed over rows) and LayerNorm's weight gradient
    // (dY * x_hat summed over rows), over a 3-d [B, T, C] gradient.
    Group g;
    g.name = "col_sums";
    const int dy = g.input(dt, {4, 50, 96}), xhat = g.input(dt, {4, 50, 96});
    g.output(g.reduce(Op::Sum, dy, {0, 1}));
    g.output(g.reduce(Op::Sum, g.binary(Op::Mul, dy, xhat), {0, 1}));
    expect_matches_eager(g,
                         {test::uniform_cpu({4, 50, 96}, dt, gen), test::uniform_cpu({4, 50, 96}, dt, gen)});
  }
}

TEST(MlirBackend, MaxAndSoftmaxFromPrimitives) {
  std::mt19937 gen(4);
  Group g;
  g.name = "softmax";
  const int x = g.input(DType::F32, {16, 200});
  const int e = g.unary(Op::Exp, g.binary(Op::Sub, x, g.reduce(Op::Max, x, {1}, true)));
  g.output(g.binary(Op::Div, e, g.reduce(Op::Sum, e, {1}, true)));
  g.output(g.reduce(Op::Max, x, {0, 1}));  // a 0-d result
  expect_matches_eager(g, {test::uniform_cpu({16, 200}, DType::F32, gen, -8.0f, 8.0f)});
}

TEST(MlirBackend, CastsRoundAsTheEagerCasts) {
  std::mt19937 gen(5);
  Group g;
  g.name = "casts";
  const int x = g.input(DType::F32, {1000}), d = g.input(DType::F64, {1000});
  g.output(g.cast(x, DType::BF16));
  g.output(g.cast(g.cast(x, DType::BF16), DType::F64));
  g.output(g.cast(d, DType::BF16));  // through f32, as the eager cast goes
  g.output(g.cast(d, DType::F32));
  const Tensor xv = test::uniform_cpu({1000}, DType::F32, gen, -1e3f, 1e3f);
  const Tensor dv =
      test::uniform_cpu({1000}, DType::F32, gen, -1e3f, 1e3f).to(DType::F64).add_(xv.to(DType::F64), 1e-9);
  const std::vector<Tensor> out = expect_matches_eager(g, {xv, dv});
  // Rounding is exact, so the bits must agree.
  const std::vector<Tensor> want = fusion::run_eager(g, {xv, dv});
  for (size_t i = 0; i < out.size(); ++i)
    EXPECT_EQ(rel_error(out[i], want[i]), 0.0)
        << "output " << i << " is not rounded as the eager cast rounds";
}

// Note [bf16 rounding in integer ops]: the compiled cast to bf16 gives the
// eager cast's bits at the edges too -- ties to even, the largest finite
// values rounding to infinity, infinities, signed zeros, subnormals, and NaNs
// of both signs with payloads (kept, quieted) -- on any x86-64 (it linked
// only where the CPU had AVX512-BF16 before).
TEST(MlirBackend, Bf16RoundingIsTheEagerBitsAtTheEdges) {
  const std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x3f808000u,
                                      0x3f818000u, 0x3f808001u, 0xbf818000u, 0x3f7fffffu, 0x7f7fffffu,
                                      0xff7fffffu, 0x7f7f7fffu, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                      0xffc00000u, 0x7f800001u, 0xff812345u, 0x7fffffffu, 0xffffffffu};
  const int64_t n = static_cast<int64_t>(bits.size());
  Group g;
  g.name = "bf16_edges";
  g.output(g.cast(g.input(DType::F32, {n}), DType::BF16));
  Tensor x = empty({n}, TensorOptions{DType::F32});
  std::memcpy(x.data_ptr(), bits.data(), bits.size() * 4);
  const std::shared_ptr<fusion::Backend> b = compiler::make_mlir_backend();
  ASSERT_TRUE(b != nullptr);
  const std::shared_ptr<fusion::Kernel> k = b->compile(g, Device::cpu());
  std::vector<Tensor> out = {empty({n}, TensorOptions{DType::BF16})};
  k->run({x}, out);
  const uint16_t* got = static_cast<const uint16_t*>(out[0].data_ptr());
  for (int64_t i = 0; i < n; ++i) {
    float f;
    std::memcpy(&f, &bits[i], 4);
    EXPECT_EQ(got[i], float_to_bf16_bits(f)) << "f32 bits 0x" << std::hex << bits[i];
  }
}

TEST(MlirBackend, AdamWWithClippingChain) {
  // One AdamW step with the clipping factor folded into the gradient, as the
  // optimizer's per-parameter chain: p, m, v in; p', m', v' out.
  std::mt19937 gen(6);
  const int64_t n = 3000;
  const double lr = 3e-4, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, clip = 0.5, bc1 = 0.19, bc2 = 0.0975;
  Group g;
  g.name = "adamw_clip";
  const DType t = DType::F32;
  const int p = g.input(t, {n}), gr = g.input(t, {n}), m = g.input(t, {n}), v = g.input(t, {n});
  const auto c = [&](double x) { return g.scalar(x, t); };
  const int gc = g.binary(Op::Mul, gr, c(clip));
  const int m1 = g.binary(Op::Add, g.binary(Op::Mul, m, c(b1)), g.binary(Op::Mul, gc, c(1 - b1)));
  const int v1 =
      g.binary(Op::Add, g.binary(Op::Mul, v, c(b2)), g.binary(Op::Mul, g.binary(Op::Mul, gc, gc), c(1 - b2)));
  const int den = g.binary(Op::Add, g.unary(Op::Sqrt, g.binary(Op::Div, v1, c(bc2))), c(eps));
  const int upd =
      g.binary(Op::Add, g.binary(Op::Div, g.binary(Op::Div, m1, c(bc1)), den), g.binary(Op::Mul, p, c(wd)));
  g.output(g.binary(Op::Sub, p, g.binary(Op::Mul, upd, c(lr))));
  g.output(m1);
  g.output(v1);
  expect_matches_eager(g, {test::uniform_cpu({n}, t, gen), test::uniform_cpu({n}, t, gen),
                           test::uniform_cpu({n}, t, gen), test::uniform_cpu({n}, t, gen, 0.0f, 1.0f)});
}

TEST(MlirBackend, StridedInputs) {
  // Inputs that are views: a transpose and a column slice, read in place.
  std::mt19937 gen(7);
  const Group g = test::layer_norm_group(DType::F32, 33, 64);
  const Tensor xt = test::uniform_cpu({64, 33}, DType::F32, gen).t();  // [33, 64], strides [1, 33]
  const Tensor wide = test::uniform_cpu({2, 128}, DType::F32, gen);
  const Tensor w = wide.select(0, 0).slice(0, 0, 128, 2),
               b = wide.select(0, 1).slice(0, 1, 128, 2);  // stride 2
  ASSERT_FALSE(xt.is_contiguous());
  ASSERT_FALSE(w.is_contiguous());
  expect_matches_eager(g, {xt, w, b});
}

TEST(MlirBackend, DumpsEachStage) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "bt_test_compile_dump";
  std::filesystem::remove_all(dir);
  compiler::BackendOptions opts;
  opts.dump_dir = dir.string();
  const std::shared_ptr<fusion::Backend> b = compiler::make_mlir_backend(opts);
  ASSERT_TRUE(b);
  b->compile(test::bias_gelu_group(DType::F32, 4, 8), Device::cpu());
  const auto read = [](const std::filesystem::path& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  const std::filesystem::path g = dir / "fused_bias_gelu";
  EXPECT_NE(read(g / "group.txt").find("= tanh"), std::string::npos);
  EXPECT_NE(read(g / "linalg.mlir").find("linalg.generic"), std::string::npos);
  EXPECT_NE(read(g / "llvm-dialect.mlir").find("llvm.func @fused_bias_gelu"), std::string::npos);
  EXPECT_NE(read(g / "module.ll").find("define void @fused_bias_gelu"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(MlirBackend, SaysWhatItCannotDo) {
  const std::shared_ptr<fusion::Backend> b = compiler::make_mlir_backend();
  ASSERT_TRUE(b);
  EXPECT_EQ(b->name(), "mlir");
  EXPECT_EQ(b->unavailable(Device::cpu()), "");
  const Group g = test::bias_gelu_group(DType::F32, 2, 3);
  std::string msg;
  if (!cuda_available()) {  // CI: CUDA built without a driver to load GPU code (ASan: built without CUDA)
    const std::string why = b->unavailable(Device::cuda(0));
    EXPECT_TRUE(why.find("GPU code made at run time needs an NVIDIA driver") != std::string::npos ||
                why.find("built without CUDA") != std::string::npos)
        << why;
    msg = test::error_message([&] { b->compile(g, Device::cuda(0)); });
    EXPECT_NE(msg.find("cannot compile fusion group 'bias_gelu'"), std::string::npos) << msg;
  }
  // A kernel checks what it is given.
  const std::shared_ptr<fusion::Kernel> k = b->compile(g, Device::cpu());
  Tensor out = empty({2, 3});
  msg = test::error_message([&] { k->run({zeros({2, 3}), zeros({4})}, {out}); });
  EXPECT_NE(msg.find("input 1 must be f32[3]; got f32[4]"), std::string::npos) << msg;
}

TEST(MlirBackend, InstallsItselfAsTheFusionBackend) {
  EXPECT_EQ(fusion::backend()->name(), "none");
  EXPECT_TRUE(compiler::install_fusion_backend());
  EXPECT_EQ(fusion::backend()->name(), "mlir");
  fusion::set_backend(nullptr);
  EXPECT_EQ(fusion::backend()->name(), "none");
}

}  // namespace
}  // namespace bt
