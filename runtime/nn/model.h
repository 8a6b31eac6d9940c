// nn::Model: what the Trainer, the strategies, sampling and checkpoints see of
// a language model. A family (runtime/nn/registry.h) is a folder under
// runtime/nn/ whose model derives from this class: GPT-2 (gpt2/), Llama (llama/).
//
// Note [The Model interface]
// A model owns its f32 master parameters, in a fixed order with stable
// names, each declared with add_param() together with the unit it belongs
// to: the group of parameters used together (the embeddings and head, one
// block, ...), which ZeRO-3 gathers at a time through a WeightSource
// (weight_source.h) and which a later split of the model across pipeline
// stages moves as one piece. add_param() also records whether AdamW decays
// the parameter and whether the forward uses it in f32 under bf16 (the fused
// LayerNorm's affine). A forward brackets each unit's computation with
// enter(u) ... leave(u, outs) and takes every weight through compute() (or
// f32() for a keeps_f32 parameter): these are the only places a weight
// source acts, so every family gets ZeRO-3 from the same few lines and no
// strategy parses parameter names. A family writes hidden(), its network up
// to the LM head; forward(), loss() and forward_cached() are this class's,
// the head in unit 0 for every family. forward() gives logits over
// padded_vocab() columns, of which the first vocab_size() are real; loss()
// is the mean cross-entropy the Trainer differentiates. Nothing here names a
// layer, so the Trainer and the strategies work for any family.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/autograd/recompute.h"
#include "runtime/nn/model_config.h"
#include "runtime/nn/weight_source.h"
#include "runtime/tensor/factory.h"
#include "runtime/tensor/tensor.h"

namespace bt::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class KvCache;

class Model {
 public:
  virtual ~Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return cfg_; }
  /// The family: "gpt2", "llama".
  const std::string& arch() const { return cfg_.arch; }
  const Device& device() const { return device_; }
  /// Real tokens; ids at or above it are padding (never predicted).
  int64_t vocab_size() const { return cfg_.vocab_size; }
  /// Columns of the logits (the embedding's rows), >= vocab_size().
  int64_t padded_vocab() const { return cfg_.padded_vocab(); }
  /// The longest context forward() takes.
  int64_t context() const { return cfg_.seq_len; }
  /// Training FLOPs per token (forward + backward) at context T, for MFU.
  double flops_per_token(int64_t T) const { return cfg_.flops_per_token(T); }
  /// The hyperparameters that fix the parameters' shapes, by name: written
  /// beside the weights (with model_config_json) and checked when they are read.
  virtual std::map<std::string, int64_t> shape_attrs() const = 0;

  /// idx: i32 [B, T] with T <= context() -> logits [B, T, padded_vocab()] in
  /// the compute dtype.
  Tensor forward(const Tensor& idx) const;
  /// Mean cross-entropy of the logits of idx against targets (i32 [B, T], -1
  /// = ignore) over the first vocab_size() columns; an f32 scalar. The head
  /// and the loss run in row chunks (linear_cross_entropy: the logits never
  /// exist whole; BT_HEAD_CHUNK_MIB=0 makes them whole, as forward does).
  /// `grad_hint` != 0: the gradient backward will bring to it (Note [Gradient
  /// in the forward pass]; the Trainer's 1 / grad_accum).
  Tensor loss(const Tensor& idx, const Tensor& targets, float grad_hint = 0.0f) const;
  /// Inference with a KV cache (kv_cache.h): the logits [B, n, padded_vocab()]
  /// of the n new tokens idx (i32 [B, n]) at positions cache.length() ..
  /// + n - 1, whose keys and values are appended to `cache`. Gives forward()'s
  /// logits for those positions. No autograd.
  Tensor forward_cached(const Tensor& idx, KvCache& cache) const;

  /// The parameters, in a fixed order, with stable names.
  const NamedTensors& named_parameters() const { return params_; }
  std::vector<Tensor> parameters() const;
  /// The unit of each parameter, in named_parameters() order (Note [The Model interface]).
  const std::vector<int>& param_units() const { return units_; }
  /// Whether AdamW decays parameter `name`.
  bool decays(const std::string& name) const { return info(name).decays; }
  /// Whether the forward uses parameter `name` in f32 under every precision
  /// (a weight source must hand it out so).
  bool keeps_f32(const std::string& name) const { return info(name).keeps_f32; }

  /// Forward takes its weights from `s` (not owned; null: the parameters).
  void set_weight_source(WeightSource* s) { source_ = s; }
  /// Which activations backward rebuilds (runtime/autograd/recompute.h).
  void set_recompute(Recompute r) { recompute_ = r; }
  Recompute recompute() const { return recompute_; }

 protected:
  Model(const ModelConfig& cfg, const Device& device);

  /// The family's network up to the LM head: the final norm's output [B, T,
  /// C] for idx (i32 [B, T]) at positions first .. first + T - 1, first =
  /// cache ? cache->length() : 0 (check_ids checks them); `head` receives the
  /// LM head's weight as the ops use it (compute()). Enters unit 0, which
  /// holds the head, and leaves it to the caller: the head is its last use.
  /// With a cache, attention reads it and appends to it (the caller advances it).
  virtual Tensor hidden(const Tensor& idx, Tensor& head, KvCache* cache) const = 0;

  struct Init {
    double std = 0.0;   // > 0: N(0, std)
    double fill = 0.0;  // else every element this value
  };
  struct ParamInfo {
    bool decays = false;
    bool keeps_f32 = false;
  };
  /// Declares parameter `name` (f32 on device(), requiring grad) in `unit`,
  /// drawn from `g` in declaration order (so CPU and CUDA initialize alike).
  Tensor add_param(const std::string& name, const Shape& shape, int unit, Init init, ParamInfo info,
                   Generator& g);

  // ---- the forward's side of a weight source (Note [The Model interface])
  /// The copy of master parameter p the ops use: the weight source's tensor
  /// when there is one; else a recorded bf16 cast under Precision::BF16 (its
  /// gradient flows back into the f32 master), else p itself.
  Tensor compute(const Tensor& p) const;
  /// A keeps_f32 parameter as the ops use it: p, or the weight source's (f32) tensor.
  Tensor f32(const Tensor& p) const;
  void enter(int unit) const;
  /// The unit's forward is over: `outs` as the weight source hands them on.
  std::vector<Tensor> leave(int unit, const std::vector<Tensor>& outs) const;
  Tensor leave(int unit, const Tensor& out) const { return leave(unit, std::vector<Tensor>{out})[0]; }
  /// Checks idx (i32 [B, T], 1 <= T, `first` + T <= context(), on device()).
  void check_ids(const Tensor& idx, int64_t first) const;

  ModelConfig cfg_;
  Recompute recompute_ = Recompute::None;

 private:
  const ParamInfo& info(const std::string& name) const;
  /// The logits [B, T, padded_vocab()] of h through the LM head; leaves unit 0.
  Tensor head_logits(const Tensor& h, const Tensor& head) const;

  Device device_;
  NamedTensors params_;
  std::vector<int> units_;
  std::vector<ParamInfo> infos_;
  std::unordered_map<std::string, size_t> index_;
  WeightSource* source_ = nullptr;
};

}  // namespace bt::nn
