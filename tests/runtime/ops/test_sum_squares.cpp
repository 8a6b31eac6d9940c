// sum_squares (runtime/ops/reduce.h) on the CPU against a float64 host sum
// (views, bf16, f64, an empty tensor), and its errors. The CUDA path:
// tests/runtime/ops/test_ops_gpu.cpp and tests/kernels/cuda/test_sum_squares.cpp.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/bt.h"
#include "tests/support/error_message.h"

namespace bt {
namespace {

double float64_sum_squares(const std::vector<Tensor>& xs) {
  double s = 0;
  for (const Tensor& x : xs)
    for (double v : x.to_vector<double>()) s += v * v;
  return s;
}

std::vector<Tensor> mixed_tensors() {
  Generator g(11);
  return {randn({7, 5}, {}, &g), randn({300}, {}, &g).to(DType::BF16), randn({4, 9}, {}, &g).t(),
          randn({3}, TensorOptions{DType::F64}, &g), randn({0}, {}, &g)};
}

TEST(SumSquares, CpuMatchesFloat64) {
  const std::vector<Tensor> xs = mixed_tensors();
  const Tensor s = sum_squares(xs);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.dtype(), DType::F32);
  const double want = float64_sum_squares(xs);
  EXPECT_NEAR(s.item<float>(), want, 1e-6 * want);
}

TEST(SumSquares, ErrorsAreNamed) {
  EXPECT_NE(test::error_message([] { sum_squares({}); }).find("no tensors"), std::string::npos);
  EXPECT_NE(test::error_message([] {
              sum_squares({zeros({2}), zeros({2}, TensorOptions{DType::I64})});
            }).find("must be one of"),
            std::string::npos);
  EXPECT_NE(test::error_message([] {
              sum_squares({zeros({2}), Tensor()});
            }).find("sum_squares"),
            std::string::npos);
}

}  // namespace
}  // namespace bt
