#include "runtime/autograd/function.h"

namespace bt::autograd {

std::vector<Tensor> LambdaNode::apply(std::vector<Tensor>&& grads) {
  BT_CHECK(fn_ != nullptr, "trying to backward through the graph a second time (at ", name_,
           "): it was freed by an earlier backward. Pass retain_graph=true to the first backward()");
  bool any = false;
  for (const Tensor& g : grads) any = any || g.defined();
  if (!any) return Grads(next_edges.size());
  Grads out = fn_(grads);
  BT_ASSERT(out.size() == next_edges.size(), name_, " returned ", out.size(), " gradients for ",
            next_edges.size(), " inputs");
  return out;
}

Node& record(const char* name, std::initializer_list<const Tensor*> inputs,
             std::initializer_list<Tensor> outputs, std::function<Grads(Grads&)> backward) {
  return record(name, std::vector<const Tensor*>(inputs), std::vector<Tensor>(outputs), std::move(backward));
}

Node& record(const char* name, const std::vector<const Tensor*>& inputs, const std::vector<Tensor>& outputs,
             std::function<Grads(Grads&)> backward) {
  auto node = std::make_shared<LambdaNode>(name, std::move(backward));
  for (const Tensor* t : inputs) node->next_edges.push_back(t && t->defined() ? edge_of(*t) : Edge{});
  node->num_outputs = static_cast<uint32_t>(outputs.size());
  uint32_t i = 0;
  for (const Tensor& o : outputs) set_history(o, node, i++);
  return *node;
}

}  // namespace bt::autograd
