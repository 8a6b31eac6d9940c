// Reading a weights file (the format: weights.h) as plain data, before any
// tensor exists: the root attributes, every tensor's name and shape, and its
// float32 data into a buffer the caller provides; and the checks that
// check_weight_attrs and load_into make, on names and shapes. Every check of
// the file's contents is here, free of the runtime's tensors, so the `weights`
// fuzz target (tests/fuzz/fuzz_weights.cpp) builds it alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/tensor/shape.h"

namespace bt {

inline constexpr const char* kWeightsFormat = "blutrain-weights";
inline constexpr int64_t kWeightsVersion = 1;

/// One tensor of a weights file: its name and shape.
struct WeightEntry {
  std::string name;
  Shape shape;
};

/// A weights file as read_weight_file reads it: all but the tensors' data.
struct WeightFileInfo {
  std::string path;
  /// The int64 root attributes other than `format` and `version`.
  std::map<std::string, int64_t> attrs;
  /// The string root attributes other than `format`.
  std::map<std::string, std::string> text_attrs;
  /// In file order: creation order when the file tracks it, else name order.
  std::vector<WeightEntry> tensors;
};

/// Reads and checks the weights file `path` (what load_weights documents), and
/// for each tensor, in file order, calls `into(entry)` for a buffer of
/// shape_numel(entry.shape) floats that receives its data. Throws bt::Error for
/// every file load_weights refuses.
WeightFileInfo read_weight_file(const std::string& path,
                                const std::function<float*(const WeightEntry&)>& into);

/// check_weight_attrs on the attributes `attrs` of the weights file `path`.
void check_weight_attrs(const std::string& path, const std::map<std::string, int64_t>& attrs,
                        const std::map<std::string, int64_t>& expected);

/// load_into's checks of names and shapes: `file` are the tensors of the weights
/// file `path`, `wanted` the parameters to fill. Returns, for each of `wanted`,
/// the index in `file` of the tensor of its name. Throws bt::Error naming the
/// tensor for a name wanted twice, a tensor missing from the file, one of
/// another shape (both printed), or a file tensor no parameter takes.
std::vector<size_t> match_weights(const std::string& path, const std::vector<WeightEntry>& file,
                                  const std::vector<WeightEntry>& wanted);

}  // namespace bt
