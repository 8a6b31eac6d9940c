#include "runtime/dist/compute_copies.h"

#include "runtime/autograd/grad_mode.h"
#include "runtime/tensor/factory.h"

namespace bt::dist {

ComputeCopies::ComputeCopies(const std::vector<ParamSpec>& ps, DType dtype) : dtype_(dtype) {
  for (const ParamSpec& p : ps) {
    BT_CHECK(p.param.dtype() == DType::F32 && p.param.is_contiguous(), "compute copies: parameter '", p.name,
             "' must be a contiguous f32 master, got ", p.param.dtype());
    Copy c{p.param, p.keep_f32 ? Tensor() : empty(p.param.shape(), TensorOptions{dtype, p.param.device()})};
    index_.emplace(p.param.impl(), copies_.size());
    copies_.push_back(std::move(c));
  }
}

ComputeCopies::Copy& ComputeCopies::find(const Tensor& param) {
  const auto it = index_.find(param.impl());
  BT_CHECK(it != index_.end(), "compute copies: the model asked for a weight the strategy does not hold");
  return copies_[it->second];
}

Tensor ComputeCopies::weight(const Tensor& param) {
  Copy& c = find(param);
  if (!c.copy.defined()) return param;  // used in f32
  Tensor w;
  {
    NoGradGuard ng;
    if (c.version != param.version()) {  // stale: written other than by AdamW (Note [Compute copies])
      c.copy.copy_(param);
      c.version = param.version();
    }
    w = c.copy.view(param.shape());  // a handle of its own for this use's autograd link
  }
  record_cast_to_master("ToDTypeBackward", param, w);
  return w;
}

std::vector<std::pair<Tensor, Tensor>> ComputeCopies::copies() const {
  std::vector<std::pair<Tensor, Tensor>> out;
  for (const Copy& c : copies_)
    if (c.copy.defined()) out.emplace_back(c.master, c.copy);
  return out;
}

uint64_t ComputeCopies::bytes() const {
  uint64_t n = 0;
  for (const Copy& c : copies_)
    if (c.copy.defined()) n += static_cast<uint64_t>(c.copy.numel()) * dtype_size(c.copy.dtype());
  return n;
}

void ComputeCopies::updated() {
  for (Copy& c : copies_)
    if (c.copy.defined() && c.master.grad().defined()) c.version = c.master.version();
}

}  // namespace bt::dist
