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
// run would compute with other bits than one process.
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

#include "runtime/autograd/recompute.h"
#include "runtime/core/precision.h"
#include "runtime/nn/model.h"
#include "runtime/nn/weight_source.h"
#include "runtime/ops/nn/layernorm.h"
#include "runtime/tensor/factory.h"

namespace bt::nn {

struct GptConfig {
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  int64_t seq_len = 256;  // maximum context (rows of wpe)
  int64_t vocab_size = 50257;
  bool fused_ops = true;  // false: written from primitive ops (Note [Primitive-op GPT])

  /// vocab_size rounded up to a multiple of 128 (Note [Padded vocabulary]).
  int64_t padded_vocab() const { return (vocab_size + 127) / 128 * 128; }
  /// Throws bt::Error naming the bad field (`where` prefixes the message).
  void validate(const std::string& where = "model") const;
  /// Parameters including the tied head once.
  int64_t num_params() const;
  /// Training FLOPs per token (forward + backward) at context T, for MFU:
  /// 6 N + 12 L C T (the PaLM-appendix count nanoGPT and llm.c use).
  double flops_per_token(int64_t T) const;
};

/// Named presets: "tiny" (a CPU demo) and "gpt2-124m". Throws for other names.
GptConfig gpt_preset(const std::string& name);
/// The preset names, for error messages and help.
std::vector<std::string> gpt_preset_names();

class Gpt final : public Model {
 public:
  /// Allocates the parameters on `device` and initializes them as GPT-2 does:
  /// N(0, 0.02) for embeddings and weights, residual projections (attn.c_proj,
  /// mlp.c_proj) N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm weight 1.
  /// Draws come from a Generator seeded with `seed`, in the order of
  /// named_parameters(), so CPU and CUDA initialize bit-identically.
  Gpt(const GptConfig& cfg, const Device& device, uint64_t seed);

  const GptConfig& config() const { return cfg_; }
  std::string arch() const override { return "gpt2"; }
  const Device& device() const override { return device_; }
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t padded_vocab() const override { return cfg_.padded_vocab(); }
  int64_t context() const override { return cfg_.seq_len; }
  double flops_per_token(int64_t T) const override { return cfg_.flops_per_token(T); }
  /// n_layer, n_head, n_embd, seq_len, vocab_size, padded_vocab.
  std::map<std::string, int64_t> shape_attrs() const override;

  /// idx: i32 [B, T] with T <= seq_len -> logits [B, T, padded_vocab] in the
  /// compute dtype (bf16 under Precision::BF16, else f32).
  Tensor forward(const Tensor& idx) const override;
  /// Mean cross-entropy of forward(idx) against targets (i32 [B, T], -1 =
  /// ignore) over the first vocab_size columns; an f32 scalar. The head and
  /// the loss run in row chunks (linear_cross_entropy: the logits never exist
  /// whole; BT_HEAD_CHUNK_MIB=0 makes them whole, as forward does).
  /// `grad_hint` != 0: the gradient backward will bring to the loss (Note
  /// [Gradient in the forward pass]; the Trainer's 1 / grad_accum).
  Tensor loss(const Tensor& idx, const Tensor& targets, float grad_hint = 0.0f) const override;

  /// Parameters in a fixed order with GPT-2/nanoGPT names ("wte", "wpe",
  /// "h.0.ln_1.weight", ..., "ln_f.bias"); Linear weights are [out, in].
  const NamedTensors& named_parameters() const override { return params_; }
  /// Every parameter with 2 dims decays: the embeddings and the Linear weights.
  bool decays(const std::string& name) const override;
  /// True for the parameters the forward uses in f32 under every precision:
  /// the LayerNorm affine, by name (Note [f32 LayerNorm parameters]), unless
  /// the model is written from primitive ops, which cast it like the rest.
  bool keeps_f32(const std::string& name) const override;
  /// The unit of each parameter (named_parameters() order): 0 for the
  /// embeddings and the final LayerNorm (wte also serves as the LM head), 1 + l
  /// for block l. Units are what ZeRO-3 gathers at a time.
  std::vector<int> param_units() const override;
  /// Forward takes its weights from `s` (not owned; null: the parameters).
  void set_weight_source(WeightSource* s) override { source_ = s; }
  /// Which activations backward rebuilds (runtime/autograd/recompute.h): none
  /// keeps them all; selective rebuilds LayerNorm and GELU outputs; full also
  /// reruns each block's forward, keeping only the block inputs.
  void set_recompute(Recompute r) override { recompute_ = r; }
  Recompute recompute() const { return recompute_; }

 private:
  struct Block {
    Tensor ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, out_w, out_b;
  };
  /// The residual stream x + d, d still to be added (undefined: none).
  struct Residual {
    Tensor x, d;
  };
  Tensor add_param(const std::string& name, const Shape& shape, double std, double fill, Generator& g);
  Tensor compute(const Tensor& p) const;
  Tensor norm_param(const Tensor& p) const;
  /// {x + d, its LayerNorm}: add_layer_norm, or layer_norm of x when d is undefined.
  ResidualNorm add_norm(const Tensor& x, const Tensor& d, const Tensor& w, const Tensor& b) const;
  /// Block b on the stream x + d; returns the stream after the attention's
  /// add and the MLP's output as the next d.
  Residual block(const Block& b, const Tensor& x, const Tensor& d) const;
  /// The final LayerNorm's output [B, T, C] for idx; `wte` receives the
  /// embedding as the head uses it (compute(wte_)). Enters unit 0, and leaves
  /// it to the caller, whose head is unit 0's last use.
  Tensor hidden(const Tensor& idx, Tensor& wte) const;
  /// x @ w^T + bias: one fused op, or (fused_ops false) the GEMM then an add.
  Tensor affine(const Tensor& x, const Tensor& w, const Tensor& bias) const;

  GptConfig cfg_;
  Device device_;
  NamedTensors params_;
  WeightSource* source_ = nullptr;
  Recompute recompute_ = Recompute::None;
  Tensor wte_, wpe_, lnf_w_, lnf_b_;
  std::vector<Block> blocks_;
};

}  // namespace bt::nn
