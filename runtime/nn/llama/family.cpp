// The llama family's description: presets, checks and counts, all functions
// of a ModelConfig alone (the model itself is llama.cpp's), so that what
// reads a config links without the model (tests/fuzz/fuzz_config.cpp).
#include "kernels/common/error.h"
#include "runtime/nn/llama/llama.h"

namespace bt::nn {

int64_t llama_ffn(const ModelConfig& c) {
  return c.ffn_hidden > 0 ? c.ffn_hidden : (8 * c.n_embd / 3 + 63) / 64 * 64;
}

namespace {

void validate_llama(const ModelConfig& c, const std::string& where) {
  const int64_t kv = c.kv_heads();
  BT_CHECK(c.n_head % kv == 0, where, ".n_kv_head (", kv, ") must divide ", where, ".n_head (", c.n_head,
           "): each K/V head serves a group of query heads");
  BT_CHECK(c.head_dim() % 2 == 0, "RoPE needs an even head dim, but ", where, ".n_embd / ", where,
           ".n_head = ", c.n_embd, " / ", c.n_head, " = ", c.head_dim());
}

/// The parameters: embedding, head if untied, blocks, final norm.
int64_t llama_params(const ModelConfig& c) {
  const int64_t C = c.n_embd, D = c.head_dim(), H = c.n_head, kv = c.kv_heads(), F = llama_ffn(c);
  const int64_t block = 2 * C + C * H * D + 2 * C * kv * D + H * D * C + 3 * C * F;
  return c.padded_vocab() * C * (c.tie_embeddings ? 1 : 2) + c.n_layer * block + C;
}

/// 6 N + 12 L C T, N without an untied embedding (a lookup, not a GEMM).
double llama_flops(const ModelConfig& c, int64_t T) {
  const int64_t n = llama_params(c) - (c.tie_embeddings ? 0 : c.padded_vocab() * c.n_embd);
  return 6.0 * static_cast<double>(n) + 12.0 * c.n_layer * c.n_embd * static_cast<double>(T);
}

ModelConfig llama_preset(int64_t layers, int64_t width, int64_t heads, int64_t kv, int64_t ffn, int64_t T) {
  ModelConfig c;
  c.arch = "llama";
  c.n_layer = layers;
  c.n_embd = width;
  c.n_head = heads;
  c.n_kv_head = kv;
  c.ffn_hidden = ffn;
  c.seq_len = T;
  c.tie_embeddings = false;
  return c;
}

}  // namespace

const Family& llama_family() {
  static const Family f{.arch = "llama",
                        .presets = {{"llama-tiny", llama_preset(4, 128, 4, 2, 384, 256)},
                                    {"llama-150m", llama_preset(12, 768, 12, 4, 2048, 1024)}},
                        .validate = validate_llama,
                        .num_params = llama_params,
                        .flops_per_token = llama_flops,
                        .make = make_llama};
  return f;
}

}  // namespace bt::nn
