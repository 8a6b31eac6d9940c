// View and stride semantics: views share storage, strides are right, and
// contiguous()/reshape copy only when they must.
#include <gtest/gtest.h>

#include "runtime/bt.h"

namespace bt {
namespace {

Tensor iota(const Shape& s) { return arange(shape_numel(s)).reshape(s); }

TEST(Views, ReshapeSharesStorageAndStrides) {
  Tensor a = iota({2, 3, 4});
  EXPECT_EQ(a.strides(), (Shape{12, 4, 1}));
  Tensor b = a.view({6, 4});
  EXPECT_TRUE(b.shares_storage(a));
  EXPECT_EQ(b.strides(), (Shape{4, 1}));
  EXPECT_EQ(a.view({-1}).shape(), (Shape{24}));
  b.fill_(7.0);
  EXPECT_EQ(a.to_vector<float>()[23], 7.0f);
}

TEST(Views, TransposeAndPermute) {
  Tensor a = iota({2, 3});
  Tensor t = a.t();
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_EQ(t.strides(), (Shape{1, 3}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  Tensor p = iota({2, 3, 4}).permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Shape{1, 12, 4}));
  Tensor c = t.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FALSE(c.shares_storage(a));
  EXPECT_EQ(c.to_vector<float>(), t.to_vector<float>());
  // Already contiguous: no copy.
  EXPECT_TRUE(a.contiguous().shares_storage(a));
}

TEST(Views, SliceNarrowSelect) {
  Tensor a = iota({4, 5});
  Tensor s = a.slice(1, 1, 5, 2);  // columns 1, 3
  EXPECT_EQ(s.shape(), (Shape{4, 2}));
  EXPECT_EQ(s.strides(), (Shape{5, 2}));
  EXPECT_EQ(s.offset(), 1);
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{1, 3, 6, 8, 11, 13, 16, 18}));
  Tensor n = a.narrow(0, 2, 2);
  EXPECT_EQ(n.offset(), 10);
  EXPECT_EQ(n.to_vector<float>()[0], 10.0f);
  Tensor row = a.select(0, -1);
  EXPECT_EQ(row.shape(), (Shape{5}));
  EXPECT_EQ(row.to_vector<float>(), (std::vector<float>{15, 16, 17, 18, 19}));
  // Writes through a strided view land in the base.
  s.fill_(-1.0);
  const auto v = a.to_vector<float>();
  EXPECT_EQ(v[1], -1.0f);
  EXPECT_EQ(v[3], -1.0f);
  EXPECT_EQ(v[2], 2.0f);
  EXPECT_THROW(a.narrow(1, 3, 3), Error);
}

TEST(Views, ReshapeOfNonContiguousCopiesViewRefuses) {
  Tensor t = iota({3, 4}).t();  // [4, 3], strides [1, 4]
  EXPECT_THROW(t.view({12}), Error);
  Tensor r = t.reshape({12});
  EXPECT_FALSE(r.shares_storage(t));
  EXPECT_EQ(r.to_vector<float>(), t.contiguous().to_vector<float>());
  // Splitting a dim of a transposed view is still a view.
  Tensor u = iota({4, 6}).t().view({2, 3, 4});
  EXPECT_EQ(u.strides(), (Shape{3, 1, 6}));
}

TEST(Views, ExpandHasZeroStride) {
  Tensor a = from_vector<float>({1, 2, 3}, {3, 1});
  Tensor e = a.expand({3, 4});
  EXPECT_EQ(e.strides(), (Shape{1, 0}));
  EXPECT_EQ(e.to_vector<float>(), (std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3}));
  EXPECT_THROW(a.expand({2, 4}), Error);
  Tensor u = a.squeeze(1).unsqueeze(0);
  EXPECT_EQ(u.shape(), (Shape{1, 3}));
}

TEST(Views, CopyIntoStridedViewAndBroadcast) {
  Tensor a = zeros({3, 4});
  a.t().slice(0, 1, 2).copy_(from_vector<float>({5, 6, 7}, {1, 3}));  // column 1
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{0, 5, 0, 0, 0, 6, 0, 0, 0, 7, 0, 0}));
  Tensor b = zeros({2, 3});
  b.copy_(from_vector<float>({1, 2, 3}, {3}));
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{1, 2, 3, 1, 2, 3}));
  // Overlapping self-copy goes through a temporary.
  Tensor c = iota({2, 2});
  c.copy_(c.t());
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{0, 2, 1, 3}));
}

TEST(Views, VersionCounterSharedAcrossViews) {
  Tensor a = zeros({4});
  Tensor v = a.slice(0, 0, 2);
  const uint64_t before = a.version();
  v.fill_(1.0);
  EXPECT_GT(a.version(), before);
  EXPECT_EQ(a.version(), v.version());
}

TEST(Views, Printing) {
  Tensor a = iota({2, 2});
  const std::string s = a.str();
  EXPECT_NE(s.find("[[0, 1]"), std::string::npos) << s;
  EXPECT_NE(s.find("dtype=f32"), std::string::npos) << s;
  EXPECT_NE(s.find("device=cpu"), std::string::npos) << s;
  const std::string big = arange(100).str();
  EXPECT_NE(big.find("..."), std::string::npos) << big;
}

}  // namespace
}  // namespace bt
