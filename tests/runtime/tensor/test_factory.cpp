// Factories, dtype conversions and the seeded generators.
#include <cmath>
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "runtime/bt.h"
#include "tests/support/error_message.h"

namespace bt {
namespace {

TEST(Factory, Constants) {
  EXPECT_EQ(zeros({2, 2}).to_vector<float>(), (std::vector<float>(4, 0)));
  EXPECT_EQ(ones({3}, TensorOptions{DType::I32}).to_vector<int32_t>(), (std::vector<int32_t>{1, 1, 1}));
  EXPECT_EQ(full({2}, 2.5, TensorOptions{DType::F64}).to_vector<double>(), (std::vector<double>{2.5, 2.5}));
  EXPECT_EQ(arange(4).to_vector<float>(), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_EQ(arange(1.0, 2.0, 0.25).to_vector<float>(), (std::vector<float>{1, 1.25, 1.5, 1.75}));
  EXPECT_EQ(arange(0).numel(), 0);
  EXPECT_THROW(empty({-1}), Error);
}

TEST(Factory, AllDTypesRoundTrip) {
  const std::vector<double> vals = {0, 1, 2, 3, 100, 7};
  for (DType dt : kAllDTypes) {
    Tensor t = from_vector<double>(vals, {6}, TensorOptions{dt});
    EXPECT_EQ(t.dtype(), dt);
    std::vector<double> back = t.to_vector<double>();
    for (size_t i = 0; i < vals.size(); ++i) {
      const double want = dt == DType::Bool ? (vals[i] != 0) : vals[i];
      EXPECT_EQ(back[i], want) << dtype_name(dt) << " element " << i;
    }
  }
}

TEST(Factory, Bf16Rounding) {
  Tensor t = from_vector<float>({1.0f + 1.0f / 256.0f, 3.14159f}, {2}).to(DType::BF16);
  const auto v = t.to_vector<float>();
  EXPECT_EQ(v[0], 1.0f);  // ties to even
  EXPECT_NEAR(v[1], 3.140625f, 1e-7);
}

TEST(Factory, SeededRandomIsDeterministicAndAdvances) {
  Generator g1(42), g2(42);
  Tensor a = randn({1000}, {}, &g1), b = randn({1000}, {}, &g2);
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  Tensor c = randn({1000}, {}, &g1);  // next 1000 draws
  EXPECT_NE(a.to_vector<float>(), c.to_vector<float>());
  EXPECT_EQ(g1.offset(), 2000u);
  // Same stream regardless of how it is chunked.
  Generator g3(42);
  Tensor whole = randn({2000}, {}, &g3);
  auto w = whole.to_vector<float>();
  auto cv = c.to_vector<float>();
  EXPECT_TRUE(std::equal(cv.begin(), cv.end(), w.begin() + 1000));
}

TEST(Factory, RandomDistributions) {
  Generator g(7);
  auto n = randn({100000}, {}, &g).to_vector<double>();
  double m = 0, s = 0;
  for (double x : n) m += x;
  m /= n.size();
  for (double x : n) s += (x - m) * (x - m);
  s = std::sqrt(s / n.size());
  EXPECT_NEAR(m, 0.0, 0.02);
  EXPECT_NEAR(s, 1.0, 0.02);
  auto u = uniform({100000}, -2, 3, {}, &g).to_vector<double>();
  double lo = 1e9, hi = -1e9, mu = 0;
  for (double x : u) {
    lo = std::min(lo, x);
    hi = std::max(hi, x);
    mu += x;
  }
  EXPECT_GE(lo, -2.0);
  EXPECT_LT(hi, 3.0);
  EXPECT_NEAR(mu / u.size(), 0.5, 0.03);
}

TEST(Factory, FromBlobAliasesCallerMemory) {
  std::vector<float> buf = {1, 2, 3, 4};
  Tensor t = from_blob(buf.data(), {2, 2}, DType::F32);
  t.fill_(9.0);
  EXPECT_EQ(buf[3], 9.0f);
  EXPECT_THROW(from_vector<float>({1, 2, 3}, {2, 2}), Error);
}

TEST(Factory, PinnedHostTensor) {
  Tensor p = arange(8).pin_memory();
  EXPECT_TRUE(p.is_pinned());
  EXPECT_EQ(p.to_vector<float>()[7], 7.0f);
}

TEST(Factory, RangesCountDownAndCanBeEmpty) {
  EXPECT_EQ(arange(3.0, 0.0, -1.0).to_vector<float>(), (std::vector<float>{3, 2, 1}));
  EXPECT_EQ(arange(2.0, 1.0, 1.0).numel(), 0);
  EXPECT_EQ(arange(0.0, 1.0, 0.3).numel(), 4);  // 0, 0.3, 0.6, 0.9
  EXPECT_EQ(arange(5, TensorOptions{DType::I64}).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(Factory, LikesKeepShapeAndDTypeButNotGrad) {
  const Tensor src = full({2, 3}, 4.0, TensorOptions{DType::BF16}.with_requires_grad());
  EXPECT_TRUE(src.requires_grad());
  EXPECT_TRUE(src.is_leaf());
  EXPECT_EQ(src.to_vector<float>(), std::vector<float>(6, 4.0f));
  for (const Tensor& t : {zeros_like(src), ones_like(src), empty_like(src)}) {
    EXPECT_EQ(t.shape(), src.shape());
    EXPECT_EQ(t.dtype(), DType::BF16);
    EXPECT_FALSE(t.requires_grad());
  }
  EXPECT_EQ(ones_like(src).to_vector<float>(), std::vector<float>(6, 1.0f));
  // normal() with std 0 is its mean exactly.
  EXPECT_EQ(normal({4}, 3.0, 0.0).to_vector<float>(), std::vector<float>(4, 3.0f));
}

TEST(Factory, ManualSeedRestartsTheDefaultGenerator) {
  manual_seed(11);
  const std::vector<float> a = rand({50}).to_vector<float>();
  EXPECT_EQ(default_generator().offset(), 50u);
  EXPECT_EQ(default_generator().seed(), 11u);
  manual_seed(11);
  EXPECT_EQ(rand({50}).to_vector<float>(), a);
  Generator g(11);
  EXPECT_EQ(rand({50}, {}, &g).to_vector<float>(), a) << "the same stream as a generator of that seed";
  manual_seed(12);
  EXPECT_NE(rand({50}).to_vector<float>(), a);
}

TEST(Factory, BadArgumentsAreErrorsThatSayWhy) {
  auto has = [](const std::function<void()>& f, const std::string& text) {
    const std::string msg = test::error_message(f);
    EXPECT_NE(msg.find(text), std::string::npos) << msg;
  };
  has([] { (void)zeros({2, -1}); }, "negative size in shape [2, -1]");
  has([] { (void)arange(0.0, 1.0, 0.0); }, "step must be non-zero");
  has([] { (void)randn({2}, TensorOptions{DType::I32}); }, "must have a floating dtype, not i32");
  has([] { (void)uniform({2}, 1.0, 1.0); }, "need lo < hi, got [1, 1)");
  has([] { (void)normal({2}, 0.0, -1.0); }, "std must be >= 0, got -1");
  has([] { (void)from_vector<float>({1, 2, 3}, {2, 2}); }, "3 values do not fill shape [2, 2] (4 elements)");
  if (cuda_available())  // without a device, naming the device comes first
    has(
        [] {
          (void)zeros({2}, TensorOptions{DType::F32, Device::cuda(0), false, true});
        },
        "pinned memory is host");
}

}  // namespace
}  // namespace bt
