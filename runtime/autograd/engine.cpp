#include "runtime/autograd/engine.h"

#include <queue>
#include <unordered_map>

#include "runtime/autograd/grad_mode.h"
#include "runtime/autograd/meta.h"
#include "runtime/compile/lazy.h"
#include "runtime/core/profiler.h"
#include "runtime/ops/elementwise.h"

namespace bt::autograd {
namespace {

struct Later {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr < b->sequence_nr; }
};

// Note [Gradients in a wider dtype]
// A backward function may return the gradient of a floating input in a wider
// floating dtype than the input's. Under Precision::BF16 every bf16 weight is
// a recorded cast of an f32 master, whose gradient is wanted in f32, so the
// ops that make weight gradients make them in f32 from bf16 data: linear's
// GEMM and bias sum, the embedding's backward (kernels/common/widen.h), and
// the LayerNorm's, whose bf16 activations take f32 parameters (and give
// their gradients in f32 for bf16 ones). Each gradient is then rounded once,
// to f32, not to bf16 and again, and no cast pass or bf16 buffer is spent on
// it.
//   The engine keeps the rule local: two gradients of one tensor that arrive
// in different dtypes are added in the wider one (f64 > f32 > bf16, f16;
// bf16 with f16 in f32), and before a node runs, each gradient of an output
// is cast to that output's dtype -- so backward functions written for one
// dtype always see it -- unless the node takes any dtype (Node::any_grad_dtype):
// the casts, whose backward g.to(src) is then a no-op when the gradient
// already has the source's dtype (ToDTypeBackward, Zero3WeightBackward), and
// AccumulateGrad, which casts to the leaf's dtype at most once and otherwise
// keeps the buffer (Note [Stealing the gradient]). So a bf16 weight cast from
// an f32 master costs no backward pass at all; GPT's tied wte sums its
// embedding's f32 gradient into its head's (accumulate); a weight whose bf16
// copy also feeds a bf16 op gets that op's bf16 gradient added in f32. The
// engine's node order is fixed, so all of this is deterministic.
DType wider(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::F64 || b == DType::F64) return DType::F64;
  return DType::F32;
}

using Pending = std::unordered_map<Node*, std::vector<Tensor>>;

// Note [Adding into the gradient so far]
// A tensor used twice gets two gradients, which the engine sums: a pass that
// reads both and writes one. A backward whose gradient is sparse -- the
// embedding's touches only the rows its indices name -- can do better by
// adding into the first: GPT's tied wte gets its head's gradient (50304 x 768
// floats) first, and the embedding's rows are then added into it, instead of
// into a zeroed table of the same size that the engine adds to the head's.
// gradient_so_far(i) gives the running node that buffer, under the test of
// Note [Stealing the gradient] (nothing else holds it), and not under lazy
// fusion, where sums are recorded. A node that adds into it returns the same
// tensor, and accumulate() sees that and adds nothing. It must give the
// bits of the sum it replaces: under lazy fusion, or when the buffer is
// shared, the engine still adds, and train.compile on and off must agree
// bit for bit (TrainDist.CompileMatchesUnderDdpAndZero3). So the embedding
// adds each named row's own sum, rounded as its zeroed table would hold it,
// onto the head's gradient: the engine's add, on those rows only.
struct Running {
  const Node* node = nullptr;
  Pending* pending = nullptr;
};
thread_local Running t_running;

void accumulate(std::vector<Tensor>& buf, uint32_t slot, Tensor g) {
  if (!g.defined()) return;
  if (buf.size() <= slot) buf.resize(slot + 1);
  Tensor& acc = buf[slot];
  if (!acc.defined()) {
    acc = std::move(g);
    return;
  }
  if (g.impl_ptr() == acc.impl_ptr()) return;      // added into (Note [Adding into the gradient so far])
  const DType dt = wider(acc.dtype(), g.dtype());  // Note [Gradients in a wider dtype]
  // Under lazy fusion the sum is recorded like any add and joins the group
  // that reads it; add_ would compute both gradients first and end the group
  // (a tensor used k times would cost k - 1 eager passes, and cut its
  // backward into k groups). A pending sum gets no memory of its own unless
  // something keeps it.
  if (dt == acc.dtype() && g.shape() == acc.shape() && !fusion::lazy_recording(acc.device()) &&
      sole_owner(acc, acc.shape()))
    acc.add_(g);  // nobody else sees acc's buffer (Note [Stealing the gradient]): add into it
  else
    acc = add(acc.to(dt), g.to(dt));
}

/// Note [Gradients in a wider dtype]: the gradients `n` gets, in its outputs' dtypes.
void cast_to_outputs(const Node& n, std::vector<Tensor>& in) {
  if (n.any_grad_dtype) return;
  for (size_t i = 0; i < in.size() && i < n.output_dtypes.size(); ++i)
    if (in[i].defined() && in[i].dtype() != n.output_dtypes[i]) in[i] = in[i].to(n.output_dtypes[i]);
}

thread_local bool t_retain = false;

}  // namespace

bool retaining_graph() { return t_retain; }

Tensor gradient_so_far(size_t input) {
  const Running& r = t_running;
  if (r.node == nullptr || input >= r.node->next_edges.size()) return {};
  const Edge& e = r.node->next_edges[input];
  if (!e.valid()) return {};
  const auto it = r.pending->find(e.fn.get());
  if (it == r.pending->end() || it->second.size() <= e.input_nr) return {};
  const Tensor& acc = it->second[e.input_nr];
  if (!acc.defined() || fusion::lazy_recording(acc.device()) || !sole_owner(acc, acc.shape())) return {};
  return acc;
}

void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph) {
  NoGradGuard no_grad;
  struct Retain {
    bool prev = t_retain;
    explicit Retain(bool on) { t_retain = on; }
    ~Retain() { t_retain = prev; }
  } retain(retain_graph);
  BT_ASSERT(roots.size() == grads.size());

  // Count, for every node reachable from the roots, how many edges lead into it.
  std::unordered_map<Node*, int> deps;
  std::vector<Node*> stack;
  std::vector<std::pair<Edge, Tensor>> root_edges;
  for (size_t i = 0; i < roots.size(); ++i) {
    Edge e = edge_of(roots[i]);
    BT_CHECK(e.valid(),
             "backward(): the tensor does not require grad and has no grad_fn; call "
             "requires_grad_() on the leaves you want gradients for before the forward pass");
    root_edges.emplace_back(e, grads[i]);
    if (deps.emplace(e.fn.get(), 0).second) stack.push_back(e.fn.get());
    deps[e.fn.get()]++;
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.valid()) continue;
      if (deps.emplace(e.fn.get(), 0).second) stack.push_back(e.fn.get());
      deps[e.fn.get()]++;
    }
  }

  Pending inputs;
  std::priority_queue<Node*, std::vector<Node*>, Later> ready;
  std::vector<std::shared_ptr<Node>> keep_alive;
  for (auto& [e, g] : root_edges) {
    accumulate(inputs[e.fn.get()], e.input_nr, g);
    keep_alive.push_back(e.fn);
    if (--deps[e.fn.get()] == 0) ready.push(e.fn.get());
  }

  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    BT_CHECK(!n->released, "trying to backward through the graph a second time (at ", n->name(),
             "): it was freed by an earlier backward. Pass retain_graph=true to the first backward() "
             "if you need to run backward twice");
    std::vector<Tensor> in = std::move(inputs[n]);
    inputs.erase(n);
    in.resize(n->num_outputs);
    std::vector<Tensor> out;
    {
      ProfileScope prof(n->name());
      cast_to_outputs(*n, in);
      struct Scope {  // a nested backward (recompute) restores the outer node
        Running prev = t_running;
        Scope(const Node* n, Pending* p) { t_running = {n, p}; }
        ~Scope() { t_running = prev; }
      } running(n, &inputs);
      out = n->apply(std::move(in));
    }
    BT_ASSERT(out.size() == n->next_edges.size() || out.empty(), n->name(), " returned ", out.size(),
              " gradients for ", n->next_edges.size(), " inputs");
    for (size_t i = 0; i < n->next_edges.size(); ++i) {
      const Edge& e = n->next_edges[i];
      if (!e.valid()) continue;
      if (i < out.size()) accumulate(inputs[e.fn.get()], e.input_nr, std::move(out[i]));
      keep_alive.push_back(e.fn);
      if (--deps[e.fn.get()] == 0) ready.push(e.fn.get());
    }
    if (!retain_graph && !n->persistent()) {
      n->release_saved();
      n->released = true;
    }
  }
}

}  // namespace bt::autograd
