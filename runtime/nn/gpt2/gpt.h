// GPT-2: token + position embeddings, pre-LN transformer blocks (causal
// self-attention, GELU MLP), a final LayerNorm and an LM head tied to the token
// embedding. Built from the runtime's fused ops; parameters are f32 masters.
//
// Note [Padded vocabulary]: the embedding has padded_vocab() rows (vocab_size
// rounded up to a multiple of 128, 50257 -> 50304) so the LM-head GEMM gets
// aligned shapes. The loss only sees the first vocab_size logit columns
// (cross_entropy's `vocab` argument), so the padded rows receive no gradient
// from the loss and never change predictions; they are decayed like any row.
//
// Note [f32 LayerNorm parameters]: under Precision::BF16 the LayerNorm weights
// and biases are not cast: the kernels read the f32 masters with bf16
// activations and write their gradients in f32 (runtime/ops/nn/layernorm.h), so
// neither a cast nor its backward runs for them. A weight source must hand
// them out in f32 too (keeps_f32(): ZeRO-3 gathers them apart), or a sharded
// run would compute with other bits than one process. The attention
// projection's bias is one of them: ln_2's residual add adds it (Note [A bias
// into the residual add] in kernels/layernorm.h), and its gradient comes from
// ln_2's backward instead of a pass of the projection's weight-gradient GEMM.
//
// The residual stream crosses a block as x + d, d not yet added: the
// previous block's MLP output (the position embeddings before block 0). The
// block's first LayerNorm adds it (Note [Residual into LayerNorm] in
// kernels/layernorm.h), as does the one after attention and ln_f. Under full
// recompute a checkpointed block keeps only the stream, one tensor, so the add
// at the end of a block (and the embeddings' add) runs as its own op there.
//
// Note [Primitive-op GPT]
// With fused_ops false (model.fused_ops) the same model, with the same
// parameters, is written from primitive ops wherever the fused ops would
// run: LayerNorm from its row mean and variance (mean, sub, mul, sqrt, div),
// GELU from its tanh formula, each linear's bias as an add after the GEMM,
// the residual adds as adds, the MLP as two linears around that GELU; the
// LayerNorm parameters go through compute() like the others (under bf16 the
// primitives compute in bf16), so keeps_f32() is false for every parameter
// and a weight source hands them out in bf16 too (zero3 under bf16 gathered
// them in f32 and failed on a dtype mismatch). Attention, the GEMMs, the embeddings and
// cross-entropy stay. Eagerly this is slow; it is what the compiler fuses
// (train.compile, docs/compiler.md). Same values as the fused model to
// rounding, not the same bits (Gpt.PrimitiveOpsGiveTheFusedModelsValues).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/nn/model.h"
#include "runtime/nn/registry.h"
#include "runtime/ops/nn/layernorm.h"

namespace bt::nn {

/// The gpt2 family: presets "tiny" (a CPU demo) and "gpt2-124m" (family.cpp).
const Family& gpt2_family();
/// A Gpt (its Family's make; c validated).
std::unique_ptr<Model> make_gpt2(const ModelConfig& c, const Device& device, uint64_t seed);

class Gpt final : public Model {
 public:
  /// Allocates the parameters on `device` and initializes them as GPT-2 does:
  /// N(0, 0.02) for embeddings and weights, residual projections (attn.c_proj,
  /// mlp.c_proj) N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm weight 1.
  /// Draws come from a Generator seeded with `seed`, in the order of
  /// named_parameters(), so CPU and CUDA initialize bit-identically.
  /// Parameters have GPT-2/nanoGPT names ("wte", "wpe", "h.0.ln_1.weight",
  /// ..., "ln_f.bias"); Linear weights are [out, in]. Units: 0 for the
  /// embeddings and the final LayerNorm (wte also serves as the LM head),
  /// 1 + l for block l. Every parameter with 2 dims decays.
  Gpt(const ModelConfig& cfg, const Device& device, uint64_t seed);

  /// n_layer, n_head, n_embd, seq_len, vocab_size, padded_vocab.
  std::map<std::string, int64_t> shape_attrs() const override;

 protected:
  /// Embeddings, the blocks and ln_f; the LM head is wte (tied).
  Tensor hidden(const Tensor& idx, Tensor& head, KvCache* cache) const override;

 private:
  struct Block {
    Tensor ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, out_w, out_b;
  };
  /// The residual stream x + d, d still to be added (undefined: none).
  struct Residual {
    Tensor x, d;
  };
  /// {x + d (+ d_bias), its LayerNorm}: add_layer_norm, or layer_norm of x
  /// when d is undefined. d_bias, when given, is the bias of the Linear that
  /// made d (Note [A bias into the residual add] in kernels/layernorm.h).
  ResidualNorm add_norm(const Tensor& x, const Tensor& d, const Tensor& w, const Tensor& b,
                        const Tensor& d_bias = Tensor()) const;
  /// Block l on the stream x + d; returns the stream after the attention's
  /// add and the MLP's output as the next d. With a cache, attention reads
  /// and extends it.
  Residual block(size_t l, const Tensor& x, const Tensor& d, KvCache* cache) const;
  /// x @ w^T + bias: one fused op, or (fused_ops false) the GEMM then an add.
  Tensor affine(const Tensor& x, const Tensor& w, const Tensor& bias) const;

  Tensor wte_, wpe_, lnf_w_, lnf_b_;
  std::vector<Block> blocks_;
};

}  // namespace bt::nn
