// The `train.recompute` setting (what each mode does: recompute.h).
#pragma once

#include <string_view>

namespace bt {

enum class Recompute { None, Selective, Full };

/// Parses "none", "selective", "full"; throws bt::Error naming the bad value.
Recompute parse_recompute(std::string_view s);
std::string_view recompute_name(Recompute r);

}  // namespace bt
