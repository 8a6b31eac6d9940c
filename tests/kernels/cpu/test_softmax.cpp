// Row softmax / log-softmax, forward and backward, against double references.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/softmax.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace bt::test {
namespace {
namespace cpu = kernels::cpu;

std::vector<double> ref_forward(const std::vector<double>& x, int64_t rows, int64_t cols, bool log) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    long double z = 0;  // no max subtraction here: inputs are moderate, long double is plenty
    for (int64_t j = 0; j < cols; ++j) z += std::exp(static_cast<long double>(x[r * cols + j]));
    for (int64_t j = 0; j < cols; ++j) {
      const long double e = std::exp(static_cast<long double>(x[r * cols + j]));
      y[r * cols + j] = static_cast<double>(log ? std::log(e / z) : e / z);
    }
  }
  return y;
}

const std::pair<int64_t, int64_t> kShapes[] = {{1, 1}, {1, 17}, {3, 33}, {17, 3}, {5, 1000}, {2, 64}};

TEST(SoftmaxCpu, Forward) {
  uint32_t seed = 1;
  for (DType dt : kFloatTypes)
    for (auto [rows, cols] : kShapes)
      for (bool log : {false, true}) {
        Buf x = rand_buf(dt, rows * cols, seed++, 3.0), y(dt, rows * cols);
        cpu::softmax_forward(dt, x.data(), y.data(), rows, cols, log);
        EXPECT_LT(rel_err(y.vals(), ref_forward(x.vals(), rows, cols, log)), tol(dt))
            << name_of(dt) << " " << rows << "x" << cols << " log=" << log;
        // In place gives the same bits.
        cpu::softmax_forward(dt, x.data(), x.data(), rows, cols, log);
        EXPECT_EQ(x.bytes, y.bytes);
      }
}

TEST(SoftmaxCpu, ForwardIsStableForHugeLogits) {
  for (DType dt : kFloatTypes) {
    // exp(1000) overflows every dtype: only a max-subtracting kernel survives.
    Buf x(dt, std::vector<double>{1000, 999, 998, -1000}), y(dt, 4), ly(dt, 4);
    cpu::softmax_forward(dt, x.data(), y.data(), 1, 4, false);
    cpu::softmax_forward(dt, x.data(), ly.data(), 1, 4, true);
    // Reference with the quantized inputs (bf16 cannot hold 999), max-shifted in double.
    const std::vector<double> v = x.vals();
    double z = 0;
    for (double t : v) z += std::exp(t - v[0]);
    std::vector<double> ref, lref;
    for (double t : v) ref.push_back(std::exp(t - v[0]) / z), lref.push_back(t - v[0] - std::log(z));
    EXPECT_LT(rel_err(y.vals(), ref), tol(dt)) << name_of(dt);
    EXPECT_LT(rel_err(ly.vals(), lref), tol(dt)) << name_of(dt);
  }
}

TEST(SoftmaxCpu, Backward) {
  uint32_t seed = 300;
  for (DType dt : kFloatTypes)
    for (auto [rows, cols] : kShapes)
      for (bool log : {false, true}) {
        Buf x = rand_buf(dt, rows * cols, seed++, 2.0), y(dt, rows * cols);
        cpu::softmax_forward(dt, x.data(), y.data(), rows, cols, log);
        Buf dy = rand_buf(dt, rows * cols, seed++), dx(dt, rows * cols);
        cpu::softmax_backward(dt, y.data(), dy.data(), dx.data(), rows, cols, log);
        // Reference: the Jacobian-vector product of the true softmax of x, in double.
        const std::vector<double> p = ref_forward(x.vals(), rows, cols, false), g = dy.vals();
        std::vector<double> ref(rows * cols);
        for (int64_t r = 0; r < rows; ++r) {
          double s = 0;
          for (int64_t j = 0; j < cols; ++j) s += log ? g[r * cols + j] : g[r * cols + j] * p[r * cols + j];
          for (int64_t j = 0; j < cols; ++j) {
            const int64_t i = r * cols + j;
            ref[i] = log ? g[i] - p[i] * s : p[i] * (g[i] - s);
          }
        }
        // BF16 y is rounded before the backward sees it: allow the same 1e-2.
        EXPECT_LT(rel_err(dx.vals(), ref), tol(dt))
            << name_of(dt) << " " << rows << "x" << cols << " log=" << log;
      }
}

TEST(SoftmaxCpu, Errors) {
  std::vector<int32_t> buf(4);
  expect_error([&] { cpu::softmax_forward(DType::I64, buf.data(), buf.data(), 1, 2, false); },
               "softmax_forward: unsupported dtype i64");
  expect_error([&] { cpu::softmax_backward(DType::F16, buf.data(), buf.data(), buf.data(), 1, 2, true); },
               "softmax_backward");
  EXPECT_THROW(cpu::softmax_forward(DType::F32, buf.data(), buf.data(), 1, -2, false), Error);
}

}  // namespace
}  // namespace bt::test
