#include "runtime/nn/model.h"

namespace bt::nn {

std::vector<Tensor> Model::parameters() const {
  std::vector<Tensor> out;
  for (const auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

}  // namespace bt::nn
