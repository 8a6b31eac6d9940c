#include "runtime/nn/llama/llama.h"

#include "kernels/common/error.h"
#include "runtime/autograd/checkpoint.h"
#include "runtime/core/profiler.h"
#include "runtime/nn/kv_cache.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/nn/attention.h"
#include "runtime/ops/nn/embedding.h"

namespace bt::nn {
std::unique_ptr<Model> make_llama(const ModelConfig& c, const Device& device, uint64_t seed) {
  return std::make_unique<Llama>(c, device, seed);
}

Llama::Llama(const ModelConfig& cfg, const Device& device, uint64_t seed)
    : Model(cfg, device), ffn_(llama_ffn(cfg)) {
  BT_CHECK(cfg_.arch == "llama", "Llama: model.arch is '", cfg_.arch, "', not llama");
  Generator g(seed);
  const int64_t C = cfg_.n_embd, HD = cfg_.n_head * cfg_.head_dim(), KD = cfg_.kv_heads() * cfg_.head_dim();
  const Init w{0.02}, one{0, 1};
  const ParamInfo decay{true, false}, norm{false, false};
  tok_ = add_param("tok_embeddings.weight", {cfg_.padded_vocab(), C}, 0, w, decay, g);
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const int u = static_cast<int>(l) + 1;
    Block b;
    b.attn_norm = add_param(p + "attention_norm.weight", {C}, u, one, norm, g);
    b.wq = add_param(p + "attention.wq.weight", {HD, C}, u, w, decay, g);
    b.wk = add_param(p + "attention.wk.weight", {KD, C}, u, w, decay, g);
    b.wv = add_param(p + "attention.wv.weight", {KD, C}, u, w, decay, g);
    b.wo = add_param(p + "attention.wo.weight", {C, HD}, u, w, decay, g);
    b.ffn_norm = add_param(p + "ffn_norm.weight", {C}, u, one, norm, g);
    b.w1 = add_param(p + "feed_forward.w1.weight", {ffn_, C}, u, w, decay, g);
    b.w3 = add_param(p + "feed_forward.w3.weight", {ffn_, C}, u, w, decay, g);
    b.w2 = add_param(p + "feed_forward.w2.weight", {C, ffn_}, u, w, decay, g);
    blocks_.push_back(b);
  }
  norm_ = add_param("norm.weight", {C}, 0, one, norm, g);
  if (!cfg_.tie_embeddings) output_ = add_param("output.weight", {cfg_.padded_vocab(), C}, 0, w, decay, g);
  rope_ = RopeTables::make(cfg_.seq_len, cfg_.head_dim(), cfg_.rope_theta, device);
}

std::map<std::string, int64_t> Llama::shape_attrs() const {
  return {{"n_layer", cfg_.n_layer},
          {"n_head", cfg_.n_head},
          {"n_kv_head", cfg_.kv_heads()},
          {"n_embd", cfg_.n_embd},
          {"ffn_hidden", ffn_},
          {"seq_len", cfg_.seq_len},
          {"vocab_size", cfg_.vocab_size},
          {"padded_vocab", padded_vocab()},
          {"tie_embeddings", cfg_.tie_embeddings}};
}

Tensor Llama::block(size_t l, const Tensor& x, const RopeTables& rope, KvCache* cache) const {
  const Block& b = blocks_[l];
  const int64_t B = x.size(0), T = x.size(1), H = cfg_.n_head, kv = cfg_.kv_heads(), D = cfg_.head_dim();
  const double eps = cfg_.norm_eps;
  const Tensor h = rms_norm(x, compute(b.attn_norm), eps);
  // One GEMM for q, k and v (Note [One GEMM for several weights]); rope reads
  // its views in place. v is copied out: attention keeps it for backward, and
  // a view would keep the whole [B, T, (H + 2 kv) D] result alive with it.
  const std::vector<Tensor> qkv = linear_split(h, {compute(b.wq), compute(b.wk), compute(b.wv)});
  const Tensor q = nn::rope(qkv[0].view({B, T, H, D}), rope);
  const Tensor k = nn::rope(qkv[1].view({B, T, kv, D}), rope);
  const Tensor v = qkv[2].contiguous().view({B, T, kv, D});
  Tensor att;
  {
    ProfileScope prof("attention");
    if (cache) {
      const int64_t first = cache->length();
      auto [K, V] = cache->append(static_cast<int64_t>(l), k, v);
      att = cached_attention(q, K, V, first);
    } else {
      att = grouped_query_attention(q, k, v);  // [B, T, H, D], K/V heads read in place
    }
  }
  const Tensor s = add(x, linear(att.view({B, T, H * D}), compute(b.wo)));
  const Tensor h2 = rms_norm(s, compute(b.ffn_norm), eps);
  const Tensor m = swiglu(linear(h2, compute(b.w1)), linear(h2, compute(b.w3)));
  return add(s, linear(m, compute(b.w2)));
}

Tensor Llama::hidden(const Tensor& idx, Tensor& head, KvCache* cache) const {
  const int64_t first = cache ? cache->length() : 0;
  check_ids(idx, first);
  autograd::RecomputeGuard recompute(recompute_);
  enter(0);
  const Tensor tok = compute(tok_);
  head = cfg_.tie_embeddings ? tok : compute(output_);
  Tensor x = embedding(tok, idx);
  const DType dt = x.dtype();
  const RopeTables rope = rope_.slice(first, idx.size(1), dt);
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const int unit = static_cast<int>(l) + 1;
    ProfileScope prof("block");
    enter(unit);
    if (recompute_ == Recompute::Full && !cache)
      x = autograd::checkpoint([this, l, rope](const Tensor& in) { return block(l, in, rope, nullptr); }, x);
    else
      x = block(l, x, rope, cache);
    x = leave(unit, x);
  }
  ProfileScope prof("final_norm");
  return rms_norm(x, compute(norm_), cfg_.norm_eps);
}

}  // namespace bt::nn
