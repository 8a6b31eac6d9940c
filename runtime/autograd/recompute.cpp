#include "runtime/autograd/recompute.h"

#include <string>

#include "kernels/common/error.h"

namespace bt {

Recompute parse_recompute(std::string_view s) {
  if (s == "none") return Recompute::None;
  if (s == "selective") return Recompute::Selective;
  if (s == "full") return Recompute::Full;
  BT_FAIL("unknown recompute mode '", std::string(s), "'; choose one of: none, selective, full");
}

std::string_view recompute_name(Recompute r) {
  switch (r) {
    case Recompute::None:
      return "none";
    case Recompute::Selective:
      return "selective";
    case Recompute::Full:
      return "full";
  }
  return "?";
}

namespace autograd {
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

}  // namespace autograd
}  // namespace bt
