// For fuzz targets that read configs: the model families' descriptions
// (runtime/nn/*/family.cpp) link without the models, whose constructors the
// families' `make` points to. Reading a config never builds a model, so
// these definitions stop the run if one is ever called.
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/nn/gpt2/gpt.h"
#include "runtime/nn/llama/llama.h"

namespace bt::nn {

std::unique_ptr<Model> make_gpt2(const ModelConfig&, const Device&, uint64_t) { __builtin_trap(); }
std::unique_ptr<Model> make_llama(const ModelConfig&, const Device&, uint64_t) { __builtin_trap(); }

}  // namespace bt::nn
