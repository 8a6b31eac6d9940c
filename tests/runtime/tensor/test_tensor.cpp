// The tensor handle itself (runtime/tensor/tensor.h, storage.h): metadata,
// item() and to_vector() on any view and dtype, printing, detach(),
// set_data_(), and storage that is released and reacquired (Note [Released
// storage]). Views and copies have their own files.
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "runtime/ops/elementwise.h"
#include "runtime/ops/reduce.h"
#include "runtime/ops/softmax.h"
#include "runtime/tensor/factory.h"
#include "tests/support/error_message.h"

namespace bt {
namespace {

Tensor iota(const Shape& s, DType dt = DType::F32) {
  return arange(shape_numel(s), TensorOptions{}.with_dtype(dt)).reshape(s);
}

TEST(Tensor, Metadata) {
  const Tensor t = iota({2, 3, 4}, DType::BF16);
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(-1), 4);
  const std::string msg = test::error_message([&] { (void)t.size(3); });
  EXPECT_NE(msg.find("dimension 3 is out of range"), std::string::npos) << msg;
  EXPECT_EQ(t.options().dtype, DType::BF16);
  EXPECT_FALSE(t.options().requires_grad);
  EXPECT_FALSE(Tensor().defined());
  // data_ptr() is element 0 of the view, not of the storage.
  const Tensor base = iota({10});
  const Tensor v = base.narrow(0, 3, 4);
  EXPECT_EQ(static_cast<char*>(v.data_ptr()) - static_cast<char*>(base.data_ptr()), 12);
  EXPECT_EQ(*v.data<float>(), 3.0f);
}

TEST(Tensor, AScalarHasNoDims) {
  const Tensor s = full({}, 3.0);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  for (int d : {0, -1}) {
    std::string msg = test::error_message([&] { (void)s.size(d); });
    EXPECT_NE(msg.find("size: dimension " + std::to_string(d) + " of a tensor with 0 dimensions"),
              std::string::npos)
        << msg;
    msg = test::error_message([&] { (void)sum(s, {d}); });
    EXPECT_NE(msg.find("sum: dimension"), std::string::npos) << msg;
  }
  EXPECT_EQ(softmax(s, -1).item<float>(), 1.0f) << "softmax takes a scalar's dim 0 or -1, as PyTorch does";
}

TEST(Tensor, ContiguityIgnoresSizeOneDims) {
  EXPECT_TRUE(iota({3, 1}).t().is_contiguous());  // [1, 3] with strides [1, 1]
  EXPECT_TRUE(iota({2, 3}).unsqueeze(1).is_contiguous());
  EXPECT_FALSE(iota({2, 3}).t().is_contiguous());
  EXPECT_FALSE(iota({3, 1}).expand({3, 2}).is_contiguous());  // stride 0
  EXPECT_TRUE(zeros({0, 3}).is_contiguous());
}

TEST(Tensor, ItemAndToVectorReadAnyViewAndDType) {
  EXPECT_EQ(full({}, 2.5).item<float>(), 2.5f);
  EXPECT_EQ(full({1, 1}, -3).item<double>(), -3.0);
  EXPECT_EQ(full({1}, 7.9).item<int32_t>(), 7) << "converts as a copy to i32 does: truncates";
  EXPECT_EQ(full({}, 0.1, TensorOptions{}.with_dtype(DType::BF16)).item<float>(), 0.10009765625f);
  EXPECT_EQ(iota({4, 5}).select(1, 2).narrow(0, 3, 1).item<int64_t>(), 17);
  const std::string msg = test::error_message([] { (void)zeros({2, 3}).item<float>(); });
  EXPECT_NE(msg.find("6 elements (shape [2, 3])"), std::string::npos) << msg;

  // A strided, offset view of bf16, read as f64: the view's elements in order.
  const Tensor v = iota({4, 6}, DType::BF16).slice(1, 1, 6, 2).t();  // [3, 4]
  EXPECT_EQ(v.to_vector<double>(), (std::vector<double>{1, 7, 13, 19, 3, 9, 15, 21, 5, 11, 17, 23}));
  EXPECT_TRUE(zeros({0, 4}).to_vector<float>().empty());
  // A tensor in the autograd graph reads the same way.
  EXPECT_EQ(mul(iota({3}).requires_grad_(), 2.0).to_vector<float>(), (std::vector<float>{0, 2, 4}));
}

TEST(Tensor, Printing) {
  EXPECT_EQ(Tensor().str(), "tensor(undefined)");
  EXPECT_EQ(full({}, 2.5).str(), "tensor(2.5, shape=[], dtype=f32, device=cpu)");
  EXPECT_EQ(iota({3}, DType::I32).str(), "tensor([0, 1, 2], shape=[3], dtype=i32, device=cpu)");
  EXPECT_EQ(arange(10).str(2), "tensor([0, 1, ..., 8, 9], shape=[10], dtype=f32, device=cpu)");
  EXPECT_NE(iota({2, 2}).t().str().find("[[0, 2],"), std::string::npos) << "a view prints its own order";
  const Tensor x = iota({2}).requires_grad_();
  EXPECT_NE(x.str().find(", requires_grad)"), std::string::npos) << x.str();
  const std::string y = mul(x, 2.0).str();
  EXPECT_NE(y.find(", grad_fn="), std::string::npos) << y;
  std::ostringstream os;
  os << x;
  EXPECT_EQ(os.str(), x.str());
}

TEST(Tensor, DetachSharesMemoryButNotTheGraph) {
  const Tensor x = iota({3}).requires_grad_();
  const Tensor y = mul(x, 2.0);
  Tensor d = y.detach();
  EXPECT_TRUE(d.shares_storage(y));
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
  EXPECT_EQ(d.grad_fn(), nullptr);
  EXPECT_EQ(d.shape(), y.shape());
  // Same memory and version counter: a write through the detached handle is
  // one autograd can see.
  const uint64_t before = y.version();
  d.fill_(1.0);
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{1, 1, 1}));
  EXPECT_GT(y.version(), before);
}

TEST(Tensor, SetDataMovesEveryHandleWithoutCopying) {
  Tensor p = iota({2, 3});
  Tensor alias = p;  // another handle to the same tensor
  Tensor flat = zeros({10});
  const Tensor slot = flat.narrow(0, 4, 6).view({2, 3});
  p.set_data_(slot);
  EXPECT_TRUE(alias.shares_storage(flat));
  EXPECT_EQ(alias.to_vector<float>(), std::vector<float>(6, 0.0f)) << "values are not copied";
  alias.fill_(5.0);
  EXPECT_EQ(flat.to_vector<float>()[4], 5.0f);
  EXPECT_EQ(flat.to_vector<float>()[3], 0.0f);

  std::string msg = test::error_message([&] { p.set_data_(zeros({3, 2})); });
  EXPECT_NE(msg.find("shape [2, 3] and dtype f32 cannot take the memory of one of shape [3, 2]"),
            std::string::npos)
      << msg;
  msg = test::error_message([&] { p.set_data_(zeros({2, 3}, TensorOptions{}.with_dtype(DType::BF16))); });
  EXPECT_NE(msg.find("dtype bf16"), std::string::npos) << msg;
  msg = test::error_message([&] { p.set_data_(Tensor()); });
  EXPECT_NE(msg.find("must be defined"), std::string::npos) << msg;
}

TEST(Storage, ReleasedMemoryIsAbsentUntilReacquired) {
  Tensor t = iota({4, 4});
  Tensor view = t.narrow(0, 1, 2);
  Storage& st = *t.impl()->storage;
  const uint64_t version = t.version();
  st.release();
  EXPECT_FALSE(st.resident());
  st.release();  // twice is fine
  for (const Tensor& h : {t, view}) {
    const std::string msg = test::error_message([&] { (void)h.to_vector<float>(); });
    EXPECT_NE(msg.find("memory was released"), std::string::npos) << msg;
    EXPECT_NE(msg.find("gather_parameters"), std::string::npos) << msg;
  }
  EXPECT_EQ(t.shape(), (Shape{4, 4})) << "the handles keep their shapes";
  st.reacquire(Stream::current(t.device()));
  EXPECT_TRUE(st.resident());
  EXPECT_EQ(st.nbytes, 64u);
  view.fill_(2.0);  // contents were undefined; writable again, views included
  EXPECT_EQ(t.to_vector<float>()[4], 2.0f);
  EXPECT_EQ(t.version(), version + 1) << "only the fill counts as a write";
}

TEST(Storage, EmptyAndBorrowedStorage) {
  Tensor e = zeros({0});
  e.impl()->storage->release();
  EXPECT_TRUE(e.impl()->storage->resident()) << "zero bytes are always resident";
  EXPECT_TRUE(e.to_vector<float>().empty());

  std::vector<float> buf = {1, 2};
  Tensor b = from_blob(buf.data(), {2}, DType::F32);
  b.impl()->storage->release();  // forgets the pointer, frees nothing
  const std::string msg = test::error_message([&] { b.impl()->storage->reacquire(Stream()); });
  EXPECT_NE(msg.find("from_blob"), std::string::npos) << msg;
  EXPECT_EQ(buf[1], 2.0f);
}

}  // namespace
}  // namespace bt
