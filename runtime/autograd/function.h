// Recording an op's backward as a lambda. Ops write
//
//   if (autograd::any_requires_grad({&a, &b}))
//     autograd::record("MulBackward", {&a, &b}, out,
//                      [sa = SavedTensor(a, "mul"), ...](Grads& g) -> Grads { ... });
//
// The lambda receives the gradients of the outputs and returns one gradient
// per input (an undefined Tensor where none is needed). It runs with grad
// mode off. Tensors it needs must be captured as SavedTensor, never as Tensor,
// so version checks apply and release after backward frees them.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/autograd/meta.h"
#include "runtime/autograd/saved.h"

namespace bt::autograd {

using Grads = std::vector<Tensor>;

class LambdaNode : public Node {
 public:
  LambdaNode(const char* name, std::function<Grads(Grads&)> fn) : name_(name), fn_(std::move(fn)) {}
  std::string name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  void release_saved() override { fn_ = nullptr; }

 private:
  const char* name_;
  std::function<Grads(Grads&)> fn_;
};

/// Connects `outputs` to a new LambdaNode over `inputs` (call only when
/// any_requires_grad(inputs) is true) and returns it, e.g. to set
/// any_grad_dtype on a cast.
Node& record(const char* name, std::initializer_list<const Tensor*> inputs,
             std::initializer_list<Tensor> outputs, std::function<Grads(Grads&)> backward);
/// The same, for inputs and outputs counted at run time.
Node& record(const char* name, const std::vector<const Tensor*>& inputs, const std::vector<Tensor>& outputs,
             std::function<Grads(Grads&)> backward);
inline Node& record(const char* name, std::initializer_list<const Tensor*> inputs, const Tensor& output,
                    std::function<Grads(Grads&)> backward) {
  return record(name, inputs, {output}, std::move(backward));
}

}  // namespace bt::autograd
