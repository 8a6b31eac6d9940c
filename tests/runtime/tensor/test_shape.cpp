// Shapes and strides: element counts, row-major strides (zero-size dims
// included), printing, dimension wrapping and NumPy broadcasting, with the
// errors that name what was wrong.
#include <initializer_list>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "runtime/tensor/shape.h"
#include "tests/support/error_message.h"

namespace bt {
namespace {

TEST(Shape, NumelAndContiguousStrides) {
  EXPECT_EQ(shape_numel({}), 1);  // a scalar
  EXPECT_EQ(shape_numel({2, 3, 4}), 24);
  EXPECT_EQ(shape_numel({2, 0, 3}), 0);
  EXPECT_EQ(contiguous_strides({}), Shape{});
  EXPECT_EQ(contiguous_strides({2, 3, 4}), (Shape{12, 4, 1}));
  EXPECT_EQ(contiguous_strides({5}), (Shape{1}));
  // A zero-size dim does not zero the strides outside it.
  EXPECT_EQ(contiguous_strides({2, 0, 3}), (Shape{3, 3, 1}));
}

TEST(Shape, Printing) {
  EXPECT_EQ(shape_str({}), "[]");
  EXPECT_EQ(shape_str({7}), "[7]");
  EXPECT_EQ(shape_str({2, 0, 3}), "[2, 0, 3]");
}

TEST(Shape, DimensionsWrapFromTheEnd) {
  EXPECT_EQ(normalize_dim(0, 3, "op"), 0);
  EXPECT_EQ(normalize_dim(2, 3, "op"), 2);
  EXPECT_EQ(normalize_dim(-1, 3, "op"), 2);
  EXPECT_EQ(normalize_dim(-3, 3, "op"), 0);
  for (const auto& [dim, ndim] :
       std::initializer_list<std::pair<int, int>>{{3, 3}, {-4, 3}, {1, 1}, {-2, 1}}) {
    const std::string msg = test::error_message([&] { (void)normalize_dim(dim, ndim, "myop"); });
    EXPECT_NE(msg.find("myop: dimension " + std::to_string(dim) + " is out of range"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("valid: " + std::to_string(-ndim) + ".." + std::to_string(ndim - 1)),
              std::string::npos)
        << msg;
  }
  // A scalar has no dimension to index (callers index its shape with the result).
  for (int dim : {0, -1}) {
    const std::string msg = test::error_message([&] { (void)normalize_dim(dim, 0, "myop"); });
    EXPECT_NE(msg.find("myop: dimension " + std::to_string(dim) + " of a tensor with 0 dimensions"),
              std::string::npos)
        << msg;
  }
}

TEST(Shape, BroadcastingFollowsNumPy) {
  EXPECT_EQ(broadcast_shapes({2, 1, 3}, {4, 1}, "op"), (Shape{2, 4, 3}));
  EXPECT_EQ(broadcast_shapes({}, {3}, "op"), (Shape{3}));
  EXPECT_EQ(broadcast_shapes({5, 1}, {}, "op"), (Shape{5, 1}));
  EXPECT_EQ(broadcast_shapes({1}, {0}, "op"), (Shape{0}));
  EXPECT_EQ(broadcast_shapes({3, 4}, {3, 4}, "op"), (Shape{3, 4}));
  const std::string msg = test::error_message([] { (void)broadcast_shapes({2, 3}, {2, 4}, "myop"); });
  EXPECT_NE(msg.find("myop: shapes [2, 3] and [2, 4] cannot be broadcast together (dimension 1: 3 vs 4)"),
            std::string::npos)
      << msg;
}

}  // namespace
}  // namespace bt
