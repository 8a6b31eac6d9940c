// Autoregressive sampling from a model. With the KV cache (the default) the
// prompt runs through the model once and each new token once more
// (Model::forward_cached); once the sequence outgrows context(), each token
// runs the model over the last context() tokens again, as full recomputation
// does, so both give the same tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/nn/model.h"

namespace bt::nn {

struct SampleOptions {
  int64_t tokens = 200;      // new tokens to draw
  double temperature = 0.8;  // > 0
  int64_t top_k = 40;        // 0 = whole vocabulary
  uint64_t seed = 1337;
  bool kv_cache = true;  // false: every token recomputes the whole window (the reference)
};

/// Continues `prompt` (non-empty) and returns only the new tokens. Draws are
/// restricted to the real vocabulary (never a padded id) and are reproducible
/// for a given seed on a given device.
std::vector<int32_t> generate(const Model& model, const std::vector<int32_t>& prompt, const SampleOptions& o);

}  // namespace bt::nn
