// What `blutrain train` leaves behind, read back by tests that compare runs:
// the rows of a metrics file and how far apart two sets of weights are.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/tensor/tensor.h"

namespace bt::test {

/// Every row of a JSONL file (--metrics), in order.
std::vector<nlohmann::json> jsonl_rows(const std::string& path);

/// The losses of a metrics file, in file order.
std::vector<double> losses(const std::string& jsonl);

/// Step -> loss. A job that restarted from a checkpoint runs some steps
/// twice and appends to the same file: the last run of a step wins.
std::map<int64_t, double> losses_by_step(const std::string& jsonl);

struct WeightDiff {
  double all = 0;    // ||a - b|| / ||b|| over every parameter together
  double worst = 0;  // the largest per-tensor ||a - b|| / ||b||
  std::string where;
  bool identical = true;  // every float bit for bit (WeightFile tensors are f32)
};

/// `x` against `ref`, tensor by tensor in order (as load_weights(...).tensors gives them).
WeightDiff weight_diff(const std::vector<std::pair<std::string, Tensor>>& x,
                       const std::vector<std::pair<std::string, Tensor>>& ref);

}  // namespace bt::test
