// Llama: token embedding, pre-norm blocks (RMSNorm; grouped-query causal
// attention with rotary position embeddings in the rotate-half convention;
// a SwiGLU MLP, down(silu(gate(x)) * up(x))), a final RMSNorm and an LM
// head, untied from the embedding unless model.tie_embeddings. No biases.
// The glue (RMSNorm, RoPE, SwiGLU, the residual adds) is primitive ops
// (layers.h) that train.compile fuses; attention is the GQA kernel, reading
// each K/V head for its group of query heads in place.
//
// Parameters (Linear weights [out, in], all N(0, 0.02), norm weights 1):
//   tok_embeddings.weight                   [Vp, C]      unit 0
//   layers.l.attention_norm.weight          [C]          unit 1 + l
//   layers.l.attention.{wq, wk, wv, wo}.weight
//                                           [H D, C], [Hkv D, C] x 2, [C, H D]
//   layers.l.ffn_norm.weight                [C]
//   layers.l.feed_forward.{w1, w3, w2}.weight
//                                           gate [F, C], up [F, C], down [C, F]
//   norm.weight                             [C]          unit 0
//   output.weight (untied only)             [Vp, C]      unit 0
// The names follow Meta's reference code; bench/llama_ref.py maps them to its modules.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/nn/llama/layers.h"
#include "runtime/nn/model.h"
#include "runtime/nn/registry.h"

namespace bt::nn {

/// The llama family: presets "llama-tiny" (a CPU demo) and "llama-150m" (family.cpp).
const Family& llama_family();
/// A Llama (its Family's make; c validated).
std::unique_ptr<Model> make_llama(const ModelConfig& c, const Device& device, uint64_t seed);
/// model.ffn_hidden, or (0) 8 C / 3 rounded up to a multiple of 64 (C = 768 -> 2048).
int64_t llama_ffn(const ModelConfig& c);

class Llama final : public Model {
 public:
  /// Draws every weight N(0, 0.02) from a Generator seeded with `seed`, in
  /// named_parameters() order (CPU and CUDA alike); norm weights are 1.
  Llama(const ModelConfig& cfg, const Device& device, uint64_t seed);

  /// n_layer, n_head, n_kv_head, n_embd, ffn_hidden, seq_len, vocab_size,
  /// padded_vocab, tie_embeddings (0/1): n_kv_head and ffn_hidden resolved.
  std::map<std::string, int64_t> shape_attrs() const override;

 protected:
  /// The embedding, the blocks and the final norm; the head is output (or
  /// the embedding, tied).
  Tensor hidden(const Tensor& idx, Tensor& head, KvCache* cache) const override;

 private:
  struct Block {
    Tensor attn_norm, wq, wk, wv, wo, ffn_norm, w1, w3, w2;
  };
  /// Block l on the residual stream x at positions of `rope`; with a cache,
  /// attention reads and extends it.
  Tensor block(size_t l, const Tensor& x, const RopeTables& rope, KvCache* cache) const;

  int64_t ffn_;
  Tensor tok_, norm_, output_;
  std::vector<Block> blocks_;
  RopeTables rope_;
};

}  // namespace bt::nn
