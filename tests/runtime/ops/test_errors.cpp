// User errors end in bt::Error with a message that names the problem.
#include <gtest/gtest.h>

#include "runtime/bt.h"
#include "tests/support/error_message.h"

namespace bt {
namespace {

#define EXPECT_ERROR_HAS(stmt, text)                                          \
  EXPECT_NE(test::error_message([&] { stmt; }).find(text), std::string::npos) \
      << test::error_message([&] { stmt; })

TEST(Errors, ShapeMismatch) {
  EXPECT_ERROR_HAS(add(zeros({2, 3}), zeros({4})), "cannot be broadcast");
  EXPECT_ERROR_HAS(add(zeros({2, 3}), zeros({4})), "[2, 3]");
  EXPECT_ERROR_HAS(matmul(zeros({2, 3}), zeros({4, 5})), "inner dimensions");
  EXPECT_ERROR_HAS(linear(zeros({2, 3}), zeros({5, 4})), "weight shape");
  EXPECT_ERROR_HAS(layer_norm(zeros({2, 3}), zeros({4}), Tensor()), "weight");
  EXPECT_ERROR_HAS(layer_norm(zeros({2, 3}), zeros({3}).to(DType::BF16), Tensor()),
                   "layer_norm: weight is bf16 but x is f32; pass it in f32");
  EXPECT_ERROR_HAS(layer_norm(zeros({2, 3}).to(DType::BF16), zeros({3}), zeros({3}).to(DType::BF16)),
                   "weight is f32 but bias is bf16; pass the parameters in one dtype");
  EXPECT_ERROR_HAS(
      add_layer_norm(zeros({2, 3}), zeros({3, 3}), Tensor(), Tensor()).out,
      "add_layer_norm: y has shape [3, 3] but must have x's shape [2, 3] or that of its trailing");
  EXPECT_ERROR_HAS(add_layer_norm(zeros({2, 3}), zeros({2, 3}).to(DType::BF16), Tensor(), Tensor()).out,
                   "add_layer_norm");
  EXPECT_ERROR_HAS(add_layer_norm(zeros({2, 3}), zeros({2, 3}), Tensor(), Tensor(), 1e-5, zeros({4})).out,
                   "add_layer_norm: y_bias has shape [4] but x has 3 features");
  EXPECT_ERROR_HAS(
      add_layer_norm(zeros({2, 3}), zeros({2, 3}), zeros({3}), Tensor(), 1e-5, zeros({3}).to(DType::F64)).out,
      "add_layer_norm: y_bias is f64 but x is f32; pass it in f32");
  EXPECT_ERROR_HAS(add_layer_norm(zeros({2, 3}).to(DType::BF16), zeros({2, 3}).to(DType::BF16), zeros({3}),
                                  Tensor(), 1e-5, zeros({3}).to(DType::BF16))
                       .out,
                   "add_layer_norm: weight is f32 but y_bias is bf16; pass the parameters in one dtype");
  EXPECT_ERROR_HAS(zeros({6}).view({4, -1}), "cannot reshape");
  EXPECT_ERROR_HAS(causal_attention(zeros({1, 1, 2, 4}), zeros({1, 1, 3, 4}), zeros({1, 1, 2, 4})),
                   "one shape");
  EXPECT_ERROR_HAS(
      grouped_query_attention(zeros({1, 2, 4, 8}), zeros({1, 2, 3, 8}), zeros({1, 2, 3, 8})),
      "grouped_query_attention: the 3 key/value heads of k and v must divide the 4 query heads of q");
  EXPECT_ERROR_HAS(grouped_query_attention(zeros({1, 2, 4, 8}), zeros({1, 2, 2, 8}), zeros({1, 2, 1, 8})),
                   "k and v must have one shape");
  EXPECT_ERROR_HAS(grouped_query_attention(zeros({1, 2, 4, 8}), zeros({1, 3, 2, 8}), zeros({1, 3, 2, 8})),
                   "but for the number of heads");
}

TEST(Errors, DTypeMismatch) {
  EXPECT_ERROR_HAS(add(zeros({2}), zeros({2}, TensorOptions{DType::F64})), "dtype mismatch");
  EXPECT_ERROR_HAS(exp(zeros({2}, TensorOptions{DType::I32})), "must be one of");
  EXPECT_ERROR_HAS(zeros({2}).data<double>(), "accessed as f64");
  EXPECT_ERROR_HAS(embedding(zeros({4, 2}), zeros({2})), "indices");
  EXPECT_ERROR_HAS(parse_dtype("float8"), "unknown dtype 'float8'");
}

TEST(Errors, OutOfRangeIndices) {
  EXPECT_ERROR_HAS(embedding(zeros({4, 2}), from_vector<int32_t>({0, 4}, {2})), "index 4 at position 1");
  EXPECT_ERROR_HAS(embedding(zeros({4, 2}), from_vector<int32_t>({-2}, {1})), "outside [0, 4)");
  EXPECT_ERROR_HAS(cross_entropy(zeros({2, 5}), from_vector<int32_t>({1, 7}, {2})), "target 7 at position 1");
  EXPECT_ERROR_HAS(zeros({2, 3}).select(1, 3), "out of range");
  EXPECT_ERROR_HAS(sum(zeros({2, 3}), {2}), "dimension 2 is out of range");
  EXPECT_ERROR_HAS(zeros({3}).item<float>(), "exactly one");
}

TEST(Errors, DeviceProblems) {
  EXPECT_ERROR_HAS(parse_device("tpu"), "unknown device 'tpu'");
  if (!cuda_available()) {
    EXPECT_ERROR_HAS(zeros({2}, TensorOptions{DType::F32, Device::cuda(0)}), "cuda:0");
  } else {
    const int n = cuda_device_count();
    EXPECT_ERROR_HAS(zeros({2}, TensorOptions{DType::F32, Device::cuda(n)}), "does not exist");
    EXPECT_ERROR_HAS(add(zeros({2}), zeros({2}, TensorOptions{DType::F32, Device::cuda(0)})), "one device");
  }
}

TEST(Errors, BadOptimizerSettings) {
  Tensor p = zeros({2}).requires_grad_();
  AdamWOptions o;
  o.lr = -1;
  EXPECT_ERROR_HAS(AdamW({p}, o), "learning rate");
  o.lr = 1e-3;
  o.beta2 = 1.0;
  EXPECT_ERROR_HAS(AdamW({p}, o), "betas");
  EXPECT_ERROR_HAS(parse_precision("fp8"), "unknown precision 'fp8'");
}

}  // namespace
}  // namespace bt
