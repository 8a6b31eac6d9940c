// KvCache: the keys and values of the positions a model has seen, per layer,
// so that generation runs each new token through the model once
// (Model::forward_cached) instead of the whole window again.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/nn/model_config.h"
#include "runtime/tensor/tensor.h"

namespace bt::nn {

class KvCache {
 public:
  /// Room for `capacity` positions (at most cfg.seq_len; 0 = cfg.seq_len) of
  /// `batch` sequences for a model of `cfg`; memory comes with the first append.
  KvCache(const ModelConfig& cfg, int64_t batch, int64_t capacity = 0);

  /// Positions cached so far (the next token's position).
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  /// Forgets every position (keeps the memory).
  void clear() { length_ = 0; }

  /// Layer `layer`'s keys and values k, v [B, n, kv heads, head dim] of
  /// positions length() .. + n - 1: copies them in and returns the layer's
  /// keys and values of positions [0, length() + n), [B, L, kv heads, head dim].
  std::pair<Tensor, Tensor> append(int64_t layer, const Tensor& k, const Tensor& v);
  /// Every layer has appended n positions: length() moves on by n.
  void advance(int64_t n);

 private:
  int64_t layers_, batch_, capacity_, heads_, dim_, length_ = 0;
  std::vector<Tensor> k_, v_;
};

/// Attention of n new queries q [B, n, H, D] at positions first .. first + n
/// - 1 over keys and values k, v [B, first + n, Hkv, D] (Hkv dividing H):
/// causal, scale 1 / sqrt(D); returns [B, n, H, D]. first = 0 is the causal
/// attention kernel itself; later positions multiply out the scores (inference
/// only). The result is contiguous.
Tensor cached_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t first);

}  // namespace bt::nn
