#include "runtime/autograd/recompute_mode.h"

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

}  // namespace bt
