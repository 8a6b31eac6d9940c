// Autograd metadata, the AccumulateGrad sink, and the Tensor autograd methods.
#include <atomic>

#include "runtime/autograd/engine.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/autograd/meta.h"
#include "runtime/ops/elementwise.h"
#include "runtime/tensor/factory.h"

namespace bt {

namespace {
thread_local bool t_grad_enabled = true;
std::atomic<uint64_t> g_next_sequence_nr{0};
}  // namespace

bool GradMode::enabled() { return t_grad_enabled; }
void GradMode::set_enabled(bool on) { t_grad_enabled = on; }

Node::Node() : sequence_nr(g_next_sequence_nr.fetch_add(1)) {}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  Tensor g = std::move(grads[0]);
  if (!g.defined()) return {};
  AutogradMeta& m = autograd::meta(leaf_);
  if (!m.grad.defined()) {
    // Note [Stealing the gradient]: the first gradient of a leaf becomes its
    // .grad without a copy when nothing else can see the buffer -- this
    // handle is the only one of its impl, the impl the only one of its
    // storage, and the storage holds exactly this contiguous tensor (a fresh
    // GEMM, reduction or cast output). Later accumulations add into it in
    // place, which would otherwise write into memory another tensor, a saved
    // activation or a view, still reads. Anything shared gets a fresh buffer;
    // casts and contiguous() of a non-contiguous view already produce one.
    // (The engine's sum of two gradients of one tensor adds into the first by
    // the same test, except under lazy fusion, where the sum is recorded.) A
    // gradient in another dtype than the leaf's (Note [Gradients in a wider
    // dtype]) is cast once here, and added in the leaf's dtype later.
    if (g.dtype() != leaf_.dtype())
      m.grad = g.to(leaf_.dtype());
    else if (autograd::sole_owner(g, leaf_.shape()))
      m.grad = std::move(g);
    else
      m.grad = g.is_contiguous() ? g.clone() : g.contiguous();
  } else {
    BT_CHECK(m.grad.shape() == leaf_.shape(), "the .grad of a tensor of shape ", shape_str(leaf_.shape()),
             " has shape ", shape_str(m.grad.shape()));
    m.grad.add_(g);
  }
  for (auto& hook : m.grad_ready_hooks) hook(leaf_);
  return {};
}

namespace autograd {

AutogradMeta& meta(const Tensor& t) {
  BT_ASSERT(t.defined());
  if (!t.impl()->autograd) t.impl()->autograd = std::make_unique<AutogradMeta>();
  return *t.impl()->autograd;
}

AutogradMeta* meta_or_null(const Tensor& t) { return t.defined() ? t.impl()->autograd.get() : nullptr; }

Edge edge_of(const Tensor& t) {
  AutogradMeta* m = meta_or_null(t);
  if (!m) return {};
  if (m->grad_fn) return {m->grad_fn, m->output_nr};
  if (!m->requires_grad) return {};
  std::shared_ptr<Node> acc = m->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(Tensor(t.impl_ptr()));
    m->grad_accumulator = acc;
  }
  return {acc, 0};
}

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (!GradMode::enabled()) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->requires_grad()) return true;
  return false;
}

bool sole_owner(const Tensor& g, const Shape& shape) {
  const std::shared_ptr<TensorImpl>& impl = g.impl_ptr();
  return !g.requires_grad() && impl.use_count() == 1 && impl->storage.use_count() == 1 && g.offset() == 0 &&
         g.is_contiguous() && g.shape() == shape && impl->storage->nbytes == g.nbytes();
}

void set_history(const Tensor& out, const std::shared_ptr<Node>& fn, uint32_t output_nr) {
  if (!fn) return;
  AutogradMeta& m = meta(out);
  m.grad_fn = fn;
  m.output_nr = output_nr;
  if (fn->output_dtypes.size() <= output_nr) fn->output_dtypes.resize(output_nr + 1, out.dtype());
  fn->output_dtypes[output_nr] = out.dtype();
}

}  // namespace autograd

bool Tensor::requires_grad() const {
  const AutogradMeta* m = autograd::meta_or_null(*this);
  return m && (m->requires_grad || m->grad_fn);
}

Tensor& Tensor::requires_grad_(bool on) {
  BT_CHECK(is_leaf(), "requires_grad_() can only be changed on leaf tensors; this one is the output of ",
           grad_fn()->name(), ". Use detach() to make a new leaf");
  BT_CHECK(!on || is_floating(dtype()), "only floating-point tensors can require grad, not ", dtype());
  autograd::meta(*this).requires_grad = on;
  return *this;
}

bool Tensor::is_leaf() const {
  const AutogradMeta* m = autograd::meta_or_null(*this);
  return !m || !m->grad_fn;
}

Tensor Tensor::grad() const {
  const AutogradMeta* m = autograd::meta_or_null(*this);
  return m ? m->grad : Tensor();
}

void Tensor::set_grad(const Tensor& g) const {
  if (g.defined()) {
    BT_CHECK(g.shape() == shape() && g.device() == device(), "set_grad: gradient of shape ",
             shape_str(g.shape()), " on ", g.device(), " does not match the tensor's shape ",
             shape_str(shape()), " on ", device());
  }
  autograd::meta(*this).grad = g;
}

void Tensor::zero_grad() const {
  Tensor g = grad();
  if (g.defined()) g.zero_();
}

std::shared_ptr<Node> Tensor::grad_fn() const {
  const AutogradMeta* m = autograd::meta_or_null(*this);
  return m ? m->grad_fn : nullptr;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  Tensor g = gradient;
  if (!g.defined()) {
    BT_CHECK(numel() == 1,
             "backward(): a gradient can be created implicitly only for a scalar output, but this "
             "tensor has shape ",
             shape_str(shape()), "; pass a gradient of the same shape");
    g = ones(shape(), options());
  }
  BT_CHECK(g.shape() == shape(), "backward(): gradient shape ", shape_str(g.shape()),
           " does not match the tensor's shape ", shape_str(shape()));
  autograd::run_backward({*this}, {g}, retain_graph);
}

void Tensor::register_grad_ready_hook(std::function<void(const Tensor&)> hook) const {
  BT_CHECK(is_leaf() && requires_grad(),
           "grad-ready hooks can only be registered on leaf tensors that require grad");
  autograd::meta(*this).grad_ready_hooks.push_back(std::move(hook));
}

}  // namespace bt
