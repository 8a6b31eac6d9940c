#include "runtime/autograd/recompute.h"

#include <string>

#include "kernels/common/error.h"

namespace bt::autograd {

namespace {
thread_local Recompute t_mode = Recompute::None;
}  // namespace

Recompute recompute_mode() { return t_mode; }

RecomputeGuard::RecomputeGuard(Recompute r) : prev_(t_mode) { t_mode = r; }
RecomputeGuard::~RecomputeGuard() { t_mode = prev_; }

void make_recomputable(const Tensor& out, std::function<Tensor()> make) {
  if (t_mode == Recompute::None || !out.defined()) return;
  Storage& s = *out.impl()->storage;
  if (s.recompute || out.offset() != 0 || !out.is_contiguous() || s.nbytes != out.nbytes()) return;
  auto r = std::make_shared<Recipe>();
  r->make = std::move(make);
  s.recompute = std::move(r);
}

}  // namespace bt::autograd
