// Integer settings read from the environment (BT_NUM_THREADS, the chunk and
// scratch budgets): one parser, one message shape.
#pragma once

#include <cstdint>

namespace bt {

/// The integer in environment variable `name`, or `fallback` when it is unset
/// or empty. Throws bt::Error -- naming the variable, its value, the range
/// [lo, hi] and `what` it sets -- when the value is not an integer in range.
int64_t env_int(const char* name, int64_t fallback, int64_t lo, int64_t hi, const char* what);

}  // namespace bt
