// reduce_dim (Sum, Mean, Max + argmax) over [outer, dim, inner] layouts.
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/reduce.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace bt::test {
namespace {
using kernels::ReduceOp;
namespace cpu = kernels::cpu;

struct Shape {
  int64_t outer, dim, inner;
};
const Shape kShapes[] = {{1, 1, 1},    {1, 17, 1}, {3, 33, 1},   {2, 5, 3}, {4, 1, 7},
                         {1, 1000, 1}, {5, 3, 17}, {2, 100, 33}, {17, 8, 1}};

// Against double sums of the stored values, at the output dtype's tolerance:
// for a bf16 input summed into an f32 output (a bias gradient for an f32
// master), f32's, which an output rounded to bf16 fails.
TEST(ReduceCpu, SumAndMean) {
  const std::pair<DType, DType> dtypes[] = {{DType::F32, DType::F32},
                                            {DType::F64, DType::F64},
                                            {DType::BF16, DType::BF16},
                                            {DType::BF16, DType::F32}};
  uint32_t seed = 1;
  for (const auto& [dt, out_dt] : dtypes)
    for (const Shape& s : kShapes)
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean}) {
        // Offset away from zero so no output is a cancellation-dominated sum.
        std::vector<double> v = randn(s.outer * s.dim * s.inner, seed++);
        for (auto& x : v) x += 1.0;
        Buf in(dt, v), out(out_dt, s.outer * s.inner);
        if (out_dt == dt)
          cpu::reduce_dim(op, dt, in.data(), out.data(), s.outer, s.dim, s.inner, nullptr);
        else
          cpu::reduce_dim(op, dt, out_dt, in.data(), out.data(), s.outer, s.dim, s.inner);
        const std::vector<double> x = in.vals();
        std::vector<double> ref(s.outer * s.inner, 0.0);
        for (int64_t o = 0; o < s.outer; ++o)
          for (int64_t i = 0; i < s.inner; ++i) {
            double acc = 0;
            for (int64_t d = 0; d < s.dim; ++d) acc += x[(o * s.dim + d) * s.inner + i];
            ref[o * s.inner + i] = op == ReduceOp::Mean ? acc / s.dim : acc;
          }
        EXPECT_LT(rel_err(out.vals(), ref), tol(out_dt))
            << name_of(dt) << " into " << name_of(out_dt) << " [" << s.outer << "," << s.dim << "," << s.inner
            << "] op " << static_cast<int>(op);
      }
}

TEST(ReduceCpu, TheInputsDtypeAsOutputIsThePlainReduction) {
  // The same dtype on both sides is the plain reduction.
  Buf in(DType::F32, randn(12, 7)), a(DType::F32, 3), b(DType::F32, 3);
  cpu::reduce_dim(ReduceOp::Sum, DType::F32, DType::F32, in.data(), a.data(), 1, 4, 3);
  cpu::reduce_dim(ReduceOp::Sum, DType::F32, in.data(), b.data(), 1, 4, 3, nullptr);
  EXPECT_EQ(a.bytes, b.bytes);
}

TEST(ReduceCpu, MaxAndArgmax) {
  uint32_t seed = 50;
  for (DType dt : kFloatTypes)
    for (const Shape& s : kShapes) {
      std::vector<double> v = randn(s.outer * s.dim * s.inner, seed++);
      // Plant repeated maxima: argmax must report the first one.
      for (int64_t o = 0; o < s.outer; ++o)
        for (int64_t i = 0; i < s.inner; ++i)
          if (s.dim >= 3) {
            v[(o * s.dim + 1) * s.inner + i] = 10.0;
            v[(o * s.dim + s.dim - 1) * s.inner + i] = 10.0;
          }
      Buf in(dt, v), out(dt, s.outer * s.inner), out2(dt, s.outer * s.inner);
      std::vector<int64_t> arg(s.outer * s.inner, -7);
      cpu::reduce_dim(ReduceOp::Max, dt, in.data(), out.data(), s.outer, s.dim, s.inner, arg.data());
      cpu::reduce_dim(ReduceOp::Max, dt, in.data(), out2.data(), s.outer, s.dim, s.inner, nullptr);
      EXPECT_EQ(out.bytes, out2.bytes);
      const std::vector<double> x = in.vals();
      for (int64_t o = 0; o < s.outer; ++o)
        for (int64_t i = 0; i < s.inner; ++i) {
          double best = -INFINITY;
          int64_t bi = -1;
          for (int64_t d = 0; d < s.dim; ++d)
            if (x[(o * s.dim + d) * s.inner + i] > best) best = x[(o * s.dim + d) * s.inner + i], bi = d;
          EXPECT_EQ(out.get(o * s.inner + i), best);
          EXPECT_EQ(arg[o * s.inner + i], bi) << name_of(dt) << " o=" << o << " i=" << i;
        }
    }
}

TEST(ReduceCpu, MaxPropagatesNan) {
  for (DType dt : kFloatTypes)
    for (int64_t inner : {1, 3}) {
      const int64_t dim = 6;
      std::vector<double> v = randn(dim * inner, 9);
      v[3 * inner] = std::numeric_limits<double>::quiet_NaN();  // NaN at index 3 of column 0
      v[5 * inner] = 100.0;                                     // a larger value after it
      Buf in(dt, v), out(dt, inner);
      std::vector<int64_t> arg(inner);
      cpu::reduce_dim(ReduceOp::Max, dt, in.data(), out.data(), 1, dim, inner, arg.data());
      EXPECT_TRUE(std::isnan(out.get(0))) << name_of(dt);
      EXPECT_EQ(arg[0], 3);
      if (inner > 1) {
        EXPECT_FALSE(std::isnan(out.get(1)));
      }
    }
}

TEST(ReduceCpu, EmptyAndErrors) {
  std::vector<float> out(3, 5.0f);
  cpu::reduce_dim(ReduceOp::Sum, DType::F32, nullptr, out.data(), 1, 0, 3, nullptr);
  EXPECT_EQ(out, std::vector<float>(3, 0.0f));  // a sum over nothing is 0
  std::vector<int32_t> buf(4);
  expect_error([&] { cpu::reduce_dim(ReduceOp::Sum, DType::I32, buf.data(), buf.data(), 1, 4, 1, nullptr); },
               "unsupported dtype i32");
  expect_error([&] { cpu::reduce_dim(ReduceOp::Max, DType::F32, buf.data(), buf.data(), 1, 0, 1, nullptr); },
               "empty");
  EXPECT_THROW(cpu::reduce_dim(ReduceOp::Sum, DType::F32, buf.data(), buf.data(), -1, 4, 1, nullptr), Error);
  // Another output dtype: only bf16 summed or averaged into f32.
  expect_error(
      [&] { cpu::reduce_dim(ReduceOp::Max, DType::BF16, DType::F32, buf.data(), out.data(), 1, 4, 1); },
      "reduce_dim: max keeps the input's dtype");
  expect_error(
      [&] { cpu::reduce_dim(ReduceOp::Sum, DType::F32, DType::BF16, buf.data(), buf.data(), 1, 4, 1); },
      "reduce_dim: f32 into bf16 is not supported");
  expect_error(
      [&] { cpu::reduce_dim(ReduceOp::Sum, DType::F64, DType::F32, buf.data(), buf.data(), 1, 2, 1); },
      "the one mixed pair is bf16 data into an f32 result");
}

}  // namespace
}  // namespace bt::test
