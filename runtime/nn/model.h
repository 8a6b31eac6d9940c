// nn::Model: what the Trainer, the strategies, sampling and checkpoints see of
// a language model (issue 20: a family is a folder under runtime/nn/ that
// implements this). GPT-2 (gpt.h) is the first.
//
// Note [The Model interface]
// A model owns its f32 master parameters, in a fixed order with stable
// names, and says for each the unit it belongs to: the group of parameters
// used together (the embeddings, one block, ...), which ZeRO-3 gathers at a
// time through a WeightSource (weight_source.h) and which a later split of
// the model across pipeline stages moves as one piece. Which parameters get
// weight decay and which the forward uses in f32 under bf16 (norm weights)
// are the model's to say. forward() gives logits over padded_vocab()
// columns, of which the first vocab_size() are real; loss() is the mean
// cross-entropy the Trainer differentiates. Nothing here names a layer, so
// the Trainer and the strategies work for any family.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/autograd/recompute.h"
#include "runtime/nn/weight_source.h"
#include "runtime/tensor/tensor.h"

namespace bt::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Model {
 public:
  virtual ~Model() = default;

  /// The family: "gpt2", ...
  virtual std::string arch() const = 0;
  virtual const Device& device() const = 0;
  /// Real tokens; ids at or above it are padding (never predicted).
  virtual int64_t vocab_size() const = 0;
  /// Columns of the logits (the embedding's rows), >= vocab_size().
  virtual int64_t padded_vocab() const = 0;
  /// The longest context forward() takes.
  virtual int64_t context() const = 0;
  /// Training FLOPs per token (forward + backward) at context T, for MFU.
  virtual double flops_per_token(int64_t T) const = 0;
  /// The hyperparameters that fix the parameters' shapes (layers, width,
  /// ...), by name: written beside the weights and checked when they are read.
  virtual std::map<std::string, int64_t> shape_attrs() const = 0;

  /// idx: i32 [B, T] with T <= context() -> logits [B, T, padded_vocab()] in
  /// the compute dtype.
  virtual Tensor forward(const Tensor& idx) const = 0;
  /// Mean cross-entropy of the logits of idx against targets (i32 [B, T], -1
  /// = ignore) over the first vocab_size() columns; an f32 scalar.
  /// `grad_hint` != 0: the gradient backward will bring to it (Note [Gradient
  /// in the forward pass]).
  virtual Tensor loss(const Tensor& idx, const Tensor& targets, float grad_hint = 0.0f) const = 0;

  /// The parameters, in a fixed order, with stable names.
  virtual const NamedTensors& named_parameters() const = 0;
  std::vector<Tensor> parameters() const;
  /// The unit of each parameter, in named_parameters() order (Note [The Model interface]).
  virtual std::vector<int> param_units() const = 0;
  /// Whether AdamW decays parameter `name`.
  virtual bool decays(const std::string& name) const = 0;
  /// Whether the forward uses parameter `name` in f32 under every precision
  /// (a weight source must hand it out so).
  virtual bool keeps_f32(const std::string& name) const = 0;

  /// Forward takes its weights from `s` (not owned; null: the parameters).
  virtual void set_weight_source(WeightSource* s) = 0;
  /// Which activations backward rebuilds (runtime/autograd/recompute.h).
  virtual void set_recompute(Recompute r) = 0;
};

}  // namespace bt::nn
