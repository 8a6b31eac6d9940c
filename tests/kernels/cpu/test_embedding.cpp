// Embedding lookup and backward against a naive reference.
#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/embedding.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace bt::test {
namespace {
namespace cpu = kernels::cpu;

// grad_dt: the gradient table's dtype, the table's or f32 for a bf16 one (at
// f32's tolerance, which a gradient rounded to bf16 fails).
TEST(EmbeddingCpu, ForwardAndBackward) {
  const int64_t shapes[][3] = {
      {1, 1, 1}, {3, 5, 7}, {17, 33, 100}, {50, 64, 17}, {1000, 3, 2000}};  // num, dim, n
  const std::pair<DType, DType> dtypes[] = {{DType::F32, DType::F32},
                                            {DType::F64, DType::F64},
                                            {DType::BF16, DType::BF16},
                                            {DType::BF16, DType::F32}};
  uint32_t seed = 1;
  for (const auto& [dt, grad_dt] : dtypes)
    for (auto& s : shapes) {
      const int64_t num = s[0], dim = s[1], n = s[2];
      SCOPED_TRACE(
          bt::cat(dtype_name(dt), " grad ", dtype_name(grad_dt), " num=", num, " dim=", dim, " n=", n));
      Buf table = rand_buf(dt, num * dim, seed++), out(dt, n * dim), dout = rand_buf(dt, n * dim, seed++);
      std::mt19937 gen(seed++);
      std::vector<int32_t> idx(n);
      for (auto& i : idx) i = static_cast<int32_t>(gen() % num);
      if (n > 2) idx[n - 1] = idx[0];  // repeated index: gradients add
      cpu::embedding_forward(dt, table.data(), num, dim, idx.data(), n, out.data());
      const std::vector<double> tv = table.vals(), dv = dout.vals();
      std::vector<double> ref(n * dim), rgrad(num * dim, 0.0);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < dim; ++j) {
          ref[i * dim + j] = tv[idx[i] * dim + j];
          rgrad[idx[i] * dim + j] += dv[i * dim + j];
        }
      EXPECT_EQ(out.vals(), ref);  // a lookup is exact
      Buf dtable(grad_dt, num * dim);
      for (int64_t i = 0; i < dtable.n; ++i) dtable.set(i, 5.0);  // must be zeroed first
      if (grad_dt == dt)
        cpu::embedding_backward(dt, dout.data(), idx.data(), n, num, dim, dtable.data());
      else
        cpu::embedding_backward(dt, grad_dt, dout.data(), idx.data(), n, num, dim, dtable.data());
      EXPECT_LT(rel_err(dtable.vals(), rgrad), tol(grad_dt));
      for (int64_t r = 0; r < num; ++r)
        if (std::find(idx.begin(), idx.end(), r) == idx.end()) {
          for (int64_t j = 0; j < dim; ++j) ASSERT_EQ(dtable.get(r * dim + j), 0.0) << "unused row " << r;
        }
      // With accumulate each named row's sum is added onto what the table
      // holds -- in f32 and f64 the very bits of adding the zeroed table's
      // result (what the engine did before, Note [Adding into the gradient so
      // far]) -- and unused rows keep what they held.
      const std::vector<double> zeroed = dtable.vals();
      for (int64_t i = 0; i < dtable.n; ++i) dtable.set(i, 5.0);
      cpu::embedding_backward(dt, grad_dt, dout.data(), idx.data(), n, num, dim, dtable.data(),
                              /*accumulate=*/true);
      std::vector<double> onto(rgrad);
      for (double& v : onto) v += 5.0;
      EXPECT_LT(rel_err(dtable.vals(), onto), tol(grad_dt)) << "accumulate";
      if (grad_dt != DType::BF16) {
        Buf added(grad_dt, num * dim);
        for (int64_t i = 0; i < added.n; ++i) added.set(i, 5.0 + zeroed[static_cast<size_t>(i)]);
        EXPECT_EQ(dtable.vals(), added.vals()) << "accumulate is the zeroed table's sum added on";
      }
      for (int64_t r = 0; r < num; ++r)
        if (std::find(idx.begin(), idx.end(), r) == idx.end()) {
          for (int64_t j = 0; j < dim; ++j)
            ASSERT_EQ(dtable.get(r * dim + j), 5.0) << "accumulate, row " << r;
        }
    }
}

TEST(EmbeddingCpu, Errors) {
  std::vector<float> table(12), out(12);
  std::vector<int32_t> idx = {0, 2, 4, 1};
  expect_error([&] { cpu::embedding_forward(DType::F32, table.data(), 4, 3, idx.data(), 4, out.data()); },
               "index 4 at position 2");
  EXPECT_THROW(cpu::embedding_forward(DType::F32, table.data(), 4, 3, idx.data(), 4, out.data()), Error);
  idx[2] = -1;
  expect_error([&] { cpu::embedding_backward(DType::F32, out.data(), idx.data(), 4, 4, 3, table.data()); },
               "outside [0, 4)");
  idx[2] = 3;
  expect_error([&] { cpu::embedding_forward(DType::I32, table.data(), 4, 3, idx.data(), 4, out.data()); },
               "embedding_forward: unsupported dtype i32");
  expect_error([&] { cpu::embedding_backward(DType::F16, out.data(), idx.data(), 4, 4, 3, table.data()); },
               "embedding_backward");
  expect_error(
      [&] {
        cpu::embedding_backward(DType::F32, DType::BF16, out.data(), idx.data(), 4, 4, 3, table.data());
      },
      "embedding_backward: f32 into bf16 is not supported");
}

}  // namespace
}  // namespace bt::test
