// Shapes, strides and the small helpers around them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace bt {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
/// Row-major strides (in elements) of a contiguous tensor of shape `s`.
Shape contiguous_strides(const Shape& s);
std::string shape_str(const Shape& s);
/// Maps a possibly negative dim into [0, ndim); throws bt::Error naming `what` if out of range
/// (a scalar, ndim 0, has no dims).
int normalize_dim(int64_t dim, int ndim, const char* what);
/// The broadcast shape of a and b (NumPy rules); throws bt::Error naming both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace bt
