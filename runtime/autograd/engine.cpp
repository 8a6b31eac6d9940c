#include "runtime/autograd/engine.h"

#include <queue>
#include <unordered_map>

#include "runtime/autograd/grad_mode.h"
#include "runtime/autograd/meta.h"
#include "runtime/core/profiler.h"
#include "runtime/ops/elementwise.h"

namespace bt::autograd {
namespace {

struct Later {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr < b->sequence_nr; }
};

void accumulate(std::vector<Tensor>& buf, uint32_t slot, Tensor g) {
  if (!g.defined()) return;
  if (buf.size() <= slot) buf.resize(slot + 1);
  buf[slot] = buf[slot].defined() ? add(buf[slot], g) : std::move(g);
}

thread_local bool t_retain = false;

}  // namespace

bool retaining_graph() { return t_retain; }

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

  std::unordered_map<Node*, std::vector<Tensor>> inputs;
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
