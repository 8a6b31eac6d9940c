// Copies and conversions of runtime/tensor/copy.cpp: clone(), to() a dtype
// or a device (and when they return the tensor itself), the gradient of a
// cast, pin_memory(), and the in-place writes copy_, fill_, add_ and mul_ on
// contiguous and strided views. The kernels' conversion tables are
// tests/kernels/cpu/test_copy.cpp; views are test_views.cpp.
#include <string>

#include <gtest/gtest.h>

#include "runtime/autograd/grad_mode.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/reduce.h"
#include "runtime/tensor/factory.h"
#include "tests/support/error_message.h"

namespace bt {
namespace {

Tensor iota(const Shape& s, DType dt = DType::F32) {
  return arange(shape_numel(s), TensorOptions{}.with_dtype(dt)).reshape(s);
}

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

TEST(Copy, CloneIsIndependentAndContiguous) {
  const Tensor a = iota({2, 3});
  const Tensor v = a.t();
  Tensor c = v.clone();
  EXPECT_FALSE(c.shares_storage(a));
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.shape(), (Shape{3, 2}));
  EXPECT_EQ(values(c), values(v));
  c.fill_(-1.0);
  EXPECT_EQ(values(a), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(iota({3}, DType::I64).clone().dtype(), DType::I64);
}

TEST(Copy, ToTheSameDTypeOrDeviceIsTheTensorItself) {
  const Tensor a = iota({4});
  EXPECT_TRUE(a.to(DType::F32).shares_storage(a));
  EXPECT_TRUE(a.to(Device::cpu()).shares_storage(a));
  EXPECT_TRUE(a.cpu().shares_storage(a));
  const Tensor b = a.to(DType::F64);
  EXPECT_FALSE(b.shares_storage(a));
  EXPECT_EQ(b.dtype(), DType::F64);
}

TEST(Copy, DTypeRoundTrips) {
  // Values every dtype holds exactly survive a round trip through it.
  const std::vector<float> v = {0, 1, -2, 3.5f, 100, -0.25f};
  const Tensor x = from_vector<float>(v, {2, 3}).t();  // strided
  for (DType dt : {DType::F64, DType::BF16, DType::F16}) {
    const Tensor y = x.to(dt);
    EXPECT_EQ(y.dtype(), dt);
    EXPECT_EQ(values(y.to(DType::F32)), values(x)) << dt;
  }
  // Integers keep the integral part; Bool keeps only "not zero".
  EXPECT_EQ(values(x.to(DType::I32)), (std::vector<float>{0, 3, 1, 100, -2, 0}));
  EXPECT_EQ(values(x.to(DType::Bool)), (std::vector<float>{0, 1, 1, 1, 1, 1}));
  // f32 -> bf16 rounds to nearest even; back to f32 is exact.
  const Tensor r = from_vector<float>({1.0f + 1.0f / 128 + 1.0f / 256}, {1}).to(DType::BF16);
  EXPECT_EQ(r.item<float>(), 1.0f + 2.0f / 128);
}

TEST(Copy, ACastPassesTheGradientBackInTheSourceDType) {
  const Tensor x = iota({3}).requires_grad_();
  sum(mul(x.to(DType::BF16), 3.0)).backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().dtype(), DType::F32);
  EXPECT_EQ(values(x.grad()), (std::vector<float>{3, 3, 3}));
  const std::string msg = test::error_message([&] { (void)x.to(DType::I32); });
  EXPECT_NE(msg.find("can only be cast to a floating dtype"), std::string::npos) << msg;
  NoGradGuard ng;
  EXPECT_EQ(x.to(DType::I32).dtype(), DType::I32) << "without grad mode any cast is fine";
}

TEST(Copy, ToADeviceThatIsNotHereNamesIt) {
  const Device missing = Device::cuda(cuda_device_count());
  const std::string msg = test::error_message([&] { (void)iota({2}).to(missing); });
  EXPECT_NE(msg.find(missing.str()), std::string::npos) << msg;
}

TEST(Copy, PinMemoryCopiesAViewOnce) {
  const Tensor v = iota({3, 4}).t();
  const Tensor p = v.pin_memory();
  EXPECT_TRUE(p.is_pinned());
  EXPECT_TRUE(p.is_contiguous());
  EXPECT_EQ(values(p), values(v));
  EXPECT_TRUE(p.pin_memory().shares_storage(p)) << "already pinned: no copy";
  EXPECT_FALSE(iota({2}).is_pinned());
}

TEST(Copy, CopyIntoConvertsAndBumpsTheVersion) {
  Tensor dst = zeros({2, 2}, TensorOptions{}.with_dtype(DType::I32));
  const uint64_t before = dst.version();
  dst.copy_(from_vector<double>({1.9, -1.9, 2, 3}, {2, 2}));
  EXPECT_EQ(dst.to_vector<int32_t>(), (std::vector<int32_t>{1, -1, 2, 3}));
  EXPECT_EQ(dst.version(), before + 1);
  std::string msg = test::error_message([&] { dst.copy_(zeros({3})); });
  EXPECT_NE(msg.find("cannot expand shape [3] to [2, 2]"), std::string::npos) << msg;
  msg = test::error_message([&] { dst.copy_(Tensor()); });
  EXPECT_NE(msg.find("copy_: argument 'src' is an undefined tensor"), std::string::npos) << msg;
  msg = test::error_message([] { Tensor().fill_(1.0); });
  EXPECT_NE(msg.find("undefined"), std::string::npos) << msg;
}

TEST(Copy, FillAddAndMulOnContiguousAndStridedViews) {
  Tensor a = zeros({3, 4});
  a.fill_(1.0);
  Tensor col = a.t().select(0, 1);  // column 1: strided
  col.fill_(5.0);
  col.mul_(2.0);
  a.narrow(0, 2, 1).mul_(3.0);  // row 2: contiguous
  EXPECT_EQ(values(a), (std::vector<float>{1, 10, 1, 1, 1, 10, 1, 1, 3, 30, 3, 3}));

  // add_ broadcasts, converts the other's dtype and scales it by alpha.
  Tensor b = zeros({2, 3});
  b.add_(from_vector<double>({1, 2, 3}, {3}), 2.0);
  EXPECT_EQ(values(b), (std::vector<float>{2, 4, 6, 2, 4, 6}));
  b.t().add_(ones({3, 2}));  // strided self
  EXPECT_EQ(values(b), (std::vector<float>{3, 5, 7, 3, 5, 7}));
  b.add_(b, -0.5);  // the other is b itself
  EXPECT_EQ(values(b), (std::vector<float>{1.5, 2.5, 3.5, 1.5, 2.5, 3.5}));
  const std::string msg = test::error_message([&] { b.add_(zeros({4})); });
  EXPECT_NE(msg.find("add_: shapes [2, 3] and [4] cannot be broadcast"), std::string::npos) << msg;

  Tensor bits = zeros({3}, TensorOptions{}.with_dtype(DType::Bool));
  bits.narrow(0, 1, 1).fill_(7.0);
  EXPECT_EQ(bits.to_vector<uint8_t>(), (std::vector<uint8_t>{0, 1, 0}));
}

}  // namespace
}  // namespace bt
