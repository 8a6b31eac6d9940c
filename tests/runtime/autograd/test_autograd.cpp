// Engine behaviour: accumulation, no_grad, retain_graph, freed graphs,
// version checks and grad-ready hooks.
#include <cmath>

#include <gtest/gtest.h>

#include "runtime/autograd/engine.h"
#include "runtime/autograd/function.h"
#include "runtime/bt.h"

namespace bt {
namespace {

Tensor param(std::vector<float> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return from_vector<float>(v, {n}).requires_grad_(true);
}

TEST(Autograd, GradientsAccumulateAcrossBackwards) {
  Tensor x = param({1, 2, 3});
  sum(mul(x, x)).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{2, 4, 6}));
  sum(mul(x, 3.0)).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{5, 7, 9}));
  x.zero_grad();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{0, 0, 0}));
}

// Note [Stealing the gradient]: a leaf's first gradient becomes its .grad
// without a copy only when nothing else holds the buffer. Here add's backward
// hands one gradient to both leaves (and a view of another to a third): each
// .grad must be a buffer of its own, so accumulating into one leaves the
// others as they were. The fresh product gradient of w may be taken as is.
TEST(Autograd, ASharedGradientIsNotStolen) {
  Tensor a = param({1, 2}), b = param({3, 4}), c = param({5, 6, 7, 8}), w = param({1, 2});
  Tensor s = add(a, b);  // AddBackward: the same gradient for a and b
  sum(add(mul(s, 2.0), add(c.view({2, 2}).select(0, 1), mul(w, w)))).backward();
  EXPECT_FALSE(a.grad().shares_storage(b.grad()));
  EXPECT_FALSE(a.grad().shares_storage(c.grad()));
  EXPECT_FALSE(b.grad().shares_storage(c.grad()));
  EXPECT_EQ(a.grad().to_vector<float>(), (std::vector<float>{2, 2}));
  EXPECT_EQ(b.grad().to_vector<float>(), (std::vector<float>{2, 2}));
  EXPECT_EQ(c.grad().to_vector<float>(), (std::vector<float>{0, 0, 1, 1}));
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{2, 4}));
  sum(mul(a, 5.0)).backward();  // accumulates into a's .grad in place
  EXPECT_EQ(a.grad().to_vector<float>(), (std::vector<float>{7, 7}));
  EXPECT_EQ(b.grad().to_vector<float>(), (std::vector<float>{2, 2}));
  EXPECT_EQ(c.grad().to_vector<float>(), (std::vector<float>{0, 0, 1, 1}));
}

// zero_grad(set_to_none) drops the gradients; the next backward starts them
// afresh (the local strategy's way: Note [Stealing the gradient]).
TEST(Autograd, DroppedGradientsStartAfresh) {
  Tensor x = param({1, 2, 3});
  AdamW opt({x}, AdamWOptions{});
  sum(mul(x, x)).backward();
  opt.zero_grad(/*set_to_none=*/true);
  EXPECT_FALSE(x.grad().defined());
  opt.step();  // nothing to update
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  sum(mul(x, 3.0)).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{3, 3, 3}));
}

// What a spy node saw: the dtype and buffer of the gradient it got.
struct Seen {
  DType dtype = DType::U8;
  const void* data = nullptr;
};

/// An identity op whose backward notes its gradient in `seen` and passes it
/// on; any_dtype: it takes gradients as they come (Node::any_grad_dtype).
Tensor spy(const Tensor& x, Seen& seen, bool any_dtype) {
  Tensor y;
  {
    NoGradGuard ng;
    y = x.view(x.shape());
  }
  autograd::record("SpyBackward", {&x}, y, [&seen](autograd::Grads& g) -> autograd::Grads {
    seen = {g[0].dtype(), g[0].data_ptr()};
    return {g[0]};
  }).any_grad_dtype = any_dtype;
  return y;
}

// Note [Gradients in a wider dtype]: the weight gradient of a bf16 linear is
// made in f32 by the GEMM (an embedding's by its backward), and the cast's
// backward and AccumulateGrad hand that buffer to the f32 master as it is: no
// cast, no copy. A node that takes only its output's dtype gets it cast to
// bf16 instead, and the master then holds that rounding, cast back.
TEST(Autograd, AWiderGradientReachesTheMasterUncopied) {
  Generator gen(3);
  Tensor x = randn({5, 4}, {}, &gen).to(DType::BF16);
  Tensor p = randn({3, 4}, {}, &gen).requires_grad_();  // an f32 master
  Seen seen;
  sum(linear(x, spy(p.to(DType::BF16), seen, /*any_dtype=*/true))).backward();
  EXPECT_EQ(seen.dtype, DType::F32);
  ASSERT_EQ(p.grad().dtype(), DType::F32);
  EXPECT_EQ(p.grad().data_ptr(), seen.data);
  const std::vector<float> wide = p.grad().to_vector<float>();

  Tensor q = p.detach().clone().requires_grad_();
  sum(linear(x, spy(q.to(DType::BF16), seen, /*any_dtype=*/false))).backward();
  EXPECT_EQ(seen.dtype, DType::BF16);
  ASSERT_EQ(q.grad().dtype(), DType::F32);
  EXPECT_NE(q.grad().data_ptr(), seen.data);
  const std::vector<float> narrow = q.grad().to_vector<float>();
  ASSERT_EQ(narrow.size(), wide.size());
  for (size_t i = 0; i < wide.size(); ++i)
    EXPECT_EQ(narrow[i], bf16_bits_to_float(float_to_bf16_bits(wide[i]))) << i;

  // The embedding's backward sums a bf16 table's gradient in f32 too.
  Tensor e = randn({6, 4}, {}, &gen).requires_grad_();
  sum(embedding(spy(e.to(DType::BF16), seen, /*any_dtype=*/true), from_vector<int32_t>({1, 5, 1}, {3})))
      .backward();
  EXPECT_EQ(seen.dtype, DType::F32);
  ASSERT_EQ(e.grad().dtype(), DType::F32);
  EXPECT_EQ(e.grad().data_ptr(), seen.data);
}

// A weight used twice: its bf16 copy gets a linear's f32 gradient and a bf16
// op's bf16 one (mul here). They add in f32, whichever comes first, to the
// bits of the two gradients added apart, every time.
TEST(Autograd, GradientsOfTwoDtypesAddInTheWider) {
  Generator gen(5);
  Tensor h = randn({4, 6}, {}, &gen).to(DType::BF16);
  Tensor c = randn({5, 6}, {}, &gen).to(DType::BF16);
  Tensor p = randn({5, 6}, {}, &gen).requires_grad_();
  // head_first: the linear runs first in the forward, so its gradient arrives last.
  auto grad_of = [&](bool linear_term, bool mul_term, bool head_first) {
    p.set_grad(Tensor());
    Tensor w = p.to(DType::BF16);
    Tensor loss;
    auto add_term = [&](const Tensor& t) { loss = loss.defined() ? add(loss, t) : t; };
    if (linear_term && head_first) add_term(sum(linear(h, w)));
    if (mul_term) add_term(sum(mul(w, c)));
    if (linear_term && !head_first) add_term(sum(linear(h, w)));
    loss.backward();
    EXPECT_EQ(p.grad().dtype(), DType::F32);
    return p.grad().to_vector<float>();
  };
  const std::vector<float> g_lin = grad_of(true, false, true), g_mul = grad_of(false, true, true);
  for (bool head_first : {true, false}) {
    SCOPED_TRACE(head_first ? "linear first" : "mul first");
    const std::vector<float> both = grad_of(true, true, head_first);
    ASSERT_EQ(both.size(), g_lin.size());
    for (size_t i = 0; i < both.size(); ++i) EXPECT_EQ(both[i], g_lin[i] + g_mul[i]) << i;
    EXPECT_EQ(grad_of(true, true, head_first), both);
  }
}

// Two gradients of one tensor: the engine adds the second into the first's
// buffer when nothing else holds it (Note [Stealing the gradient]), so the sum
// costs no new buffer; the values are those of the two added apart.
TEST(Autograd, GradientsSumIntoASoleBuffer) {
  Generator gen(9);
  Tensor x = randn({5, 4}, {}, &gen), c = randn({3, 4}, {}, &gen);
  Tensor p = randn({3, 4}, {}, &gen).requires_grad_();
  Seen at_sum, from_linear, from_mul;
  Tensor w = spy(mul(p, 1.0), at_sum, false);
  Tensor l = sum(linear(x, spy(w, from_linear, false)));
  Tensor m = sum(mul(spy(w, from_mul, false), c));
  add(l, m).backward();
  EXPECT_TRUE(at_sum.data == from_linear.data || at_sum.data == from_mul.data);
  const std::vector<float> both = p.grad().to_vector<float>();
  Tensor q = p.detach().clone().requires_grad_();
  sum(linear(x, q)).backward();
  const std::vector<float> g_lin = q.grad().to_vector<float>();
  q.set_grad(Tensor());
  sum(mul(q, c)).backward();
  const std::vector<float> g_mul = q.grad().to_vector<float>();
  for (size_t i = 0; i < both.size(); ++i) EXPECT_EQ(both[i], g_lin[i] + g_mul[i]) << i;
}

// AddBackward hands one gradient to both its inputs. When a's other gradient
// arrives, b's input still holds that buffer: adding into it in place would
// change b's gradient too.
TEST(Autograd, ASharedGradientIsNotSummedInPlace) {
  Tensor x = param({1, 2}), z = param({3, 4});
  Tensor a = mul(x, 1.0), b = mul(z, 1.0);
  Tensor t = sum(mul(a, 3.0));  // created before s: its gradient reaches a after AddBackward's
  Tensor s = add(a, b);
  add(t, sum(mul(s, 2.0))).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{5, 5}));
  EXPECT_EQ(z.grad().to_vector<float>(), (std::vector<float>{2, 2}));
}

// Note [Adding into the gradient so far]: a backward that adds its gradient
// into the one its input holds so far, and returns that buffer, leaves the
// sum as it is (not added twice, not lost). A buffer that a node yet to run
// also holds is not offered.
TEST(Autograd, ABackwardAddsIntoTheGradientSoFar) {
  for (bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "shared" : "sole");
    Tensor p = param({1, 2, 3}), q = param({0, 0, 0});
    // z's node is older than the one below, so it runs after it, still
    // holding the gradient that AddBackward hands to both w and z.
    Tensor w = mul(p, 1.0), z = mul(q, 1.0);
    bool offered = false;
    Tensor y = mul(w.detach(), 2.0);
    autograd::record("TwiceAddingInto", {&w}, y, [&offered](autograd::Grads& g) -> autograd::Grads {
      Tensor so_far = autograd::gradient_so_far(0);
      offered = so_far.defined();
      Tensor mine = mul(g[0], 2.0);
      if (!offered) return {mine};
      so_far.add_(mine);
      return {so_far};
    });
    // Recorded after y, so its gradient reaches w first.
    Tensor later = shared ? sum(mul(add(w, z), 3.0)) : sum(mul(w, 3.0));
    add(sum(y), later).backward();
    EXPECT_EQ(offered, !shared);
    EXPECT_EQ(p.grad().to_vector<float>(), (std::vector<float>{5, 5, 5}));
    if (shared) {
      EXPECT_EQ(q.grad().to_vector<float>(), (std::vector<float>{3, 3, 3}));
    }
  }
}

TEST(Autograd, SharedSubexpressionSumsBothPaths) {
  Tensor x = param({2});
  Tensor y = mul(x, x);  // used twice
  sum(add(y, mul(y, 3.0))).backward();
  EXPECT_FLOAT_EQ(x.grad().item<float>(), 16.0f);  // d/dx 4x^2 = 8x
}

TEST(Autograd, NoGradScopeRecordsNothing) {
  Tensor x = param({1, 2});
  Tensor y;
  {
    NoGradGuard ng;
    y = mul(x, 2.0);
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_THROW(sum(y).backward(), Error);
  EXPECT_TRUE(GradMode::enabled());
}

TEST(Autograd, RetainGraphAndFreedGraphError) {
  Tensor x = param({1, 2});
  Tensor loss = sum(exp(x));
  loss.backward(Tensor(), /*retain_graph=*/true);
  loss.backward();
  const auto g = x.grad().to_vector<float>();
  EXPECT_NEAR(g[0], 2 * std::exp(1.0f), 1e-5);
  try {
    loss.backward();
    FAIL() << "expected an error for backward through a freed graph";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("second time"), std::string::npos) << e.what();
  }
}

TEST(Autograd, InPlaceModificationOfSavedTensorIsCaught) {
  Tensor x = param({1, 2, 3});
  Tensor y = mul(x, 2.0);      // non-leaf
  Tensor z = exp(y.detach());  // exp saves its output
  Tensor w = mul(x, z);        // mul saves z
  {
    NoGradGuard ng;
    z.add_(ones({3}));  // modifies a saved tensor
  }
  try {
    sum(w).backward();
    FAIL() << "expected a version-counter error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("modified in place"), std::string::npos) << e.what();
  }
}

TEST(Autograd, InPlaceOnLeafRequiringGradIsRefused) {
  Tensor x = param({1});
  EXPECT_THROW(x.add_(ones({1})), Error);
  {
    NoGradGuard ng;
    x.add_(ones({1}));  // allowed: what an optimizer does
  }
  EXPECT_EQ(x.item<float>(), 2.0f);
  Tensor y = mul(x, 2.0);
  EXPECT_THROW(y.mul_(2.0), Error);
  EXPECT_THROW(y.requires_grad_(false), Error);
  EXPECT_THROW(from_vector<int32_t>({1}, {1}).requires_grad_(), Error);
}

TEST(Autograd, NonScalarBackwardNeedsGradient) {
  Tensor x = param({1, 2});
  Tensor y = mul(x, 2.0);
  EXPECT_THROW(y.backward(), Error);
  y.backward(from_vector<float>({1, 10}, {2}));
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{2, 20}));
}

TEST(Autograd, GradReadyHooksFireOncePerBackwardWithFinalGrad) {
  Tensor a = param({1, 1}), b = param({2, 2});
  std::vector<std::string> order;
  std::vector<float> seen;
  a.register_grad_ready_hook([&](const Tensor& t) {
    order.push_back("a");
    seen.push_back(t.grad().to_vector<float>()[0]);
  });
  b.register_grad_ready_hook([&](const Tensor&) { order.push_back("b"); });
  // a is used early and late in the forward: its hook must wait for both uses.
  Tensor h = mul(a, 3.0);
  Tensor h2 = mul(h, b);
  Tensor out = add(h2, mul(a, 5.0));
  sum(out).backward();
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(seen[0], 3.0f * 2.0f + 5.0f);         // accumulated over both paths
  sum(out.detach().requires_grad_()).backward();  // unrelated graph: no hooks
  EXPECT_EQ(order.size(), 2u);
  Tensor out2 = add(mul(a, b), 0.0);
  sum(out2).backward();
  EXPECT_EQ(order.size(), 4u);
}

TEST(Autograd, HooksFollowReverseForwardOrder) {
  // Layers applied in order p0, p1, p2: gradients become final in reverse.
  std::vector<Tensor> p = {param({1}), param({1}), param({1})};
  std::vector<int> fired;
  for (int i = 0; i < 3; ++i) p[i].register_grad_ready_hook([&, i](const Tensor&) { fired.push_back(i); });
  Tensor x = ones({1});
  for (auto& w : p) x = tanh(mul(x, w));
  sum(x).backward();
  EXPECT_EQ(fired, (std::vector<int>{2, 1, 0}));
}

TEST(Autograd, GradIntoPresetFlatBufferView) {
  // A .grad that is a view of a flat buffer keeps receiving accumulation in place.
  Tensor flat = zeros({5});
  Tensor x = param({1, 2, 3});
  x.set_grad(flat.narrow(0, 1, 3));
  sum(mul(x, x)).backward();
  EXPECT_EQ(flat.to_vector<float>(), (std::vector<float>{0, 2, 4, 6, 0}));
  x.zero_grad();
  EXPECT_EQ(flat.to_vector<float>(), (std::vector<float>(5, 0)));
}

}  // namespace
}  // namespace bt
