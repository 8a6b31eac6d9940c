// Gradient checking against float64 central finite differences.
#pragma once

#include <functional>
#include <vector>

#include "runtime/bt.h"

namespace bt::test {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

/// Random f64 CPU leaf requiring grad, values in [lo, hi).
Tensor leaf(const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0);

/// Checks d/dinputs of sum(f(inputs) * w) (w random) against central
/// differences with step eps; |analytic - numeric| <= atol + rtol |numeric|.
/// Inputs that do not require grad (e.g. indices) are left alone. Reports every
/// mismatching element through gtest (up to a limit) and returns false on any.
bool gradcheck(const Fn& f, std::vector<Tensor> inputs, double eps = 1e-6, double atol = 1e-7,
               double rtol = 1e-5);

/// ‖a − b‖ / ‖b‖ over all elements (both converted to f64 on the host).
double rel_error(const Tensor& a, const Tensor& b);

}  // namespace bt::test
