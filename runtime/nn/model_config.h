// ModelConfig: the `model:` section of a training config, for every family
// (model.arch picks one; runtime/nn/registry.h knows them). Keys a family
// does not use keep their defaults: a family refuses another value of one,
// naming it, rather than ignore it (GPT-2 and n_kv_head, ffn_hidden,
// rope_theta, tie_embeddings=false). fused_ops is GPT-2's choice between its
// hand-fused ops and primitive ones; Llama's glue is primitive ops either way.
#pragma once

#include <cstdint>
#include <string>

namespace bt::nn {

struct ModelConfig {
  std::string arch = "gpt2";  // gpt2 | llama (runtime/nn/registry.h)
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  int64_t seq_len = 256;  // maximum context
  int64_t vocab_size = 50257;
  /// K/V heads (grouped-query attention); 0 = n_head. llama only.
  int64_t n_kv_head = 0;
  /// The MLP's hidden width; 0 = the family's default (gpt2: 4 n_embd, the
  /// only width it takes; llama: 8 n_embd / 3 rounded up to a multiple of 64).
  int64_t ffn_hidden = 0;
  double rope_theta = 10000.0;  // RoPE base (llama)
  double norm_eps = 1e-5;       // LayerNorm / RMSNorm epsilon
  /// The LM head shares the token embedding (gpt2: always; llama: optional).
  bool tie_embeddings = true;
  bool fused_ops = true;  // gpt2: false = written from primitive ops (Note [Primitive-op GPT]); llama: moot

  /// vocab_size rounded up to a multiple of 128 (Note [Padded vocabulary] in gpt2/gpt.h).
  int64_t padded_vocab() const { return (vocab_size + 127) / 128 * 128; }
  int64_t head_dim() const { return n_embd / n_head; }
  /// n_kv_head with 0 resolved.
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  /// Throws bt::Error naming the bad key(s) (`where` prefixes them: "model").
  void validate(const std::string& where = "model") const;
  /// Parameters (a tied head counted once).
  int64_t num_params() const;
  /// Training FLOPs per token (forward + backward) at context T, for MFU.
  double flops_per_token(int64_t T) const;
};

/// The config as a JSON object (every field, plus padded_vocab), as weights
/// files and checkpoints keep it.
std::string model_config_json(const ModelConfig& c);
/// Reads model_config_json's text (or a checkpoint's resolved `model`
/// section): missing keys keep their defaults (files from before model.arch
/// are GPT-2), unknown ones are ignored. Throws bt::Error naming `where` for
/// text that is not a JSON object or a value of the wrong type; does not validate.
ModelConfig model_config_from_json(const std::string& text, const std::string& where);

}  // namespace bt::nn
