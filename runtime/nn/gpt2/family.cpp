// The gpt2 family's description: presets, checks and counts, all functions
// of a ModelConfig alone (the model itself is gpt.cpp's), so that what reads
// a config links without the model (tests/fuzz/fuzz_config.cpp).
#include <cmath>

#include "kernels/common/error.h"
#include "runtime/nn/gpt2/gpt.h"

namespace bt::nn {

namespace {

void validate_gpt2(const ModelConfig& c, const std::string& where) {
  BT_CHECK(c.n_kv_head == 0 || c.n_kv_head == c.n_head, where, ".n_kv_head (", c.n_kv_head,
           ") applies to model.arch=llama: GPT-2 attention has one K/V head per query head (leave it 0)");
  BT_CHECK(c.ffn_hidden == 0 || c.ffn_hidden == 4 * c.n_embd, where, ".ffn_hidden (", c.ffn_hidden,
           ") applies to model.arch=llama: GPT-2's MLP is 4 x ", where, ".n_embd wide (leave it 0)");
  BT_CHECK(c.tie_embeddings, where,
           ".tie_embeddings=false applies to model.arch=llama: GPT-2's LM head is its token embedding");
  BT_CHECK(c.rope_theta == ModelConfig().rope_theta, where, ".rope_theta (", c.rope_theta,
           ") applies to model.arch=llama: GPT-2 learns its position embeddings");
}

int64_t gpt2_params(const ModelConfig& c) {
  const int64_t C = c.n_embd;
  const int64_t per_block =
      2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C);
  return c.padded_vocab() * C + c.seq_len * C + c.n_layer * per_block + 2 * C;
}

/// 6 N + 12 L C T (the PaLM-appendix count nanoGPT and llm.c use).
double gpt2_flops(const ModelConfig& c, int64_t T) {
  return 6.0 * static_cast<double>(gpt2_params(c)) + 12.0 * c.n_layer * c.n_embd * static_cast<double>(T);
}

ModelConfig gpt2_124m() {
  ModelConfig c;
  c.n_layer = 12;
  c.n_head = 12;
  c.n_embd = 768;
  c.seq_len = 1024;
  return c;
}

}  // namespace

const Family& gpt2_family() {
  static const Family f{
      .arch = "gpt2",
      .presets = {{"tiny", ModelConfig()}, {"gpt2-124m", gpt2_124m()}},  // tiny: the defaults
      .validate = validate_gpt2,
      .num_params = gpt2_params,
      .flops_per_token = gpt2_flops,
      .make = make_gpt2};
  return f;
}

}  // namespace bt::nn
