#include "runtime/nn/gpt2/gpt.h"

#include <cmath>

#include "kernels/common/error.h"
#include "runtime/autograd/checkpoint.h"
#include "runtime/core/precision.h"
#include "runtime/core/profiler.h"
#include "runtime/nn/kv_cache.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/nn/attention.h"
#include "runtime/ops/nn/embedding.h"
#include "runtime/ops/nn/layernorm.h"
#include "runtime/ops/nn/mlp.h"
#include "runtime/ops/reduce.h"

namespace bt::nn {

std::unique_ptr<Model> make_gpt2(const ModelConfig& c, const Device& device, uint64_t seed) {
  return std::make_unique<Gpt>(c, device, seed);
}

Gpt::Gpt(const ModelConfig& cfg, const Device& device, uint64_t seed) : Model(cfg, device) {
  BT_CHECK(cfg_.arch == "gpt2", "Gpt: model.arch is '", cfg_.arch, "', not gpt2");
  Generator g(seed);
  const int64_t C = cfg_.n_embd;
  const Init w{0.02}, proj{0.02 / std::sqrt(2.0 * static_cast<double>(cfg_.n_layer))}, zero{0, 0}, one{0, 1};
  const ParamInfo decay{true, false}, bias{false, false};
  // The primitive model casts its LayerNorm parameters like the others (Note [Primitive-op GPT]).
  const ParamInfo norm{false, cfg_.fused_ops};
  wte_ = add_param("wte", {cfg_.padded_vocab(), C}, 0, w, decay, g);
  wpe_ = add_param("wpe", {cfg_.seq_len, C}, 0, w, decay, g);
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    const int u = static_cast<int>(l) + 1;
    Block b;
    b.ln1_w = add_param(h + "ln_1.weight", {C}, u, one, norm, g);
    b.ln1_b = add_param(h + "ln_1.bias", {C}, u, zero, norm, g);
    b.attn_w = add_param(h + "attn.c_attn.weight", {3 * C, C}, u, w, decay, g);
    b.attn_b = add_param(h + "attn.c_attn.bias", {3 * C}, u, zero, bias, g);
    b.proj_w = add_param(h + "attn.c_proj.weight", {C, C}, u, proj, decay, g);
    // Added by ln_2's residual add, an f32 master like its parameters (Note [f32 LayerNorm parameters]).
    b.proj_b = add_param(h + "attn.c_proj.bias", {C}, u, zero, norm, g);
    b.ln2_w = add_param(h + "ln_2.weight", {C}, u, one, norm, g);
    b.ln2_b = add_param(h + "ln_2.bias", {C}, u, zero, norm, g);
    b.fc_w = add_param(h + "mlp.c_fc.weight", {4 * C, C}, u, w, decay, g);
    b.fc_b = add_param(h + "mlp.c_fc.bias", {4 * C}, u, zero, bias, g);
    b.out_w = add_param(h + "mlp.c_proj.weight", {C, 4 * C}, u, proj, decay, g);
    b.out_b = add_param(h + "mlp.c_proj.bias", {C}, u, zero, bias, g);
    blocks_.push_back(b);
  }
  lnf_w_ = add_param("ln_f.weight", {C}, 0, one, norm, g);
  lnf_b_ = add_param("ln_f.bias", {C}, 0, zero, norm, g);
}

std::map<std::string, int64_t> Gpt::shape_attrs() const {
  return {{"n_layer", cfg_.n_layer}, {"n_head", cfg_.n_head},         {"n_embd", cfg_.n_embd},
          {"seq_len", cfg_.seq_len}, {"vocab_size", cfg_.vocab_size}, {"padded_vocab", cfg_.padded_vocab()}};
}

namespace {

/// LayerNorm over the last dim from primitive ops (Note [Primitive-op GPT]).
Tensor layer_norm_primitive(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  const Tensor mu = mean(x, {-1}, true);
  const Tensor xc = sub(x, mu);
  const Tensor var = mean(mul(xc, xc), {-1}, true);
  return add(mul(div(xc, sqrt(add(var, eps))), w), b);
}

/// GELU's tanh form, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), from primitive ops.
Tensor gelu_primitive(const Tensor& x) {
  const Tensor inner = mul(add(x, mul(mul(mul(x, x), x), 0.044715)), 0.7978845608028654);
  return mul(mul(x, 0.5), add(tanh(inner), 1.0));
}

}  // namespace

ResidualNorm Gpt::add_norm(const Tensor& x, const Tensor& d, const Tensor& w, const Tensor& b,
                           const Tensor& d_bias) const {
  const double eps = cfg_.norm_eps;
  if (!cfg_.fused_ops) {
    const Tensor s = d.defined() ? add(x, d_bias.defined() ? add(d, compute(d_bias)) : d) : x;
    return {s, layer_norm_primitive(s, compute(w), compute(b), eps)};
  }
  // The f32 masters under every precision (Note [f32 LayerNorm parameters]).
  if (!d.defined()) return {x, layer_norm(x, f32(w), f32(b), eps)};
  return add_layer_norm(x, d, f32(w), f32(b), eps, d_bias.defined() ? f32(d_bias) : Tensor());
}

Tensor Gpt::affine(const Tensor& x, const Tensor& w, const Tensor& bias) const {
  if (cfg_.fused_ops) return linear(x, compute(w), compute(bias));
  return add(linear(x, compute(w)), compute(bias));
}

Gpt::Residual Gpt::block(size_t l, const Tensor& x, const Tensor& d, KvCache* cache) const {
  const Block& b = blocks_[l];
  auto [s, h] = add_norm(x, d, b.ln1_w, b.ln1_b);
  Tensor qkv = affine(h, b.attn_w, b.attn_b);
  Tensor att;
  {
    ProfileScope prof_attn("attention");
    if (cache) {
      const int64_t B = qkv.size(0), n = qkv.size(1), C = cfg_.n_embd, H = cfg_.n_head;
      auto part = [&](int64_t i) { return qkv.narrow(-1, i * C, C).view({B, n, H, C / H}); };
      const int64_t first = cache->length();
      auto [K, V] = cache->append(static_cast<int64_t>(l), part(1), part(2));
      att = cached_attention(part(0), K, V, first).view({B, n, C});
    } else {
      // [B, T, 3C] -> [B, T, C], heads read and merged in place.
      att = causal_self_attention(qkv, cfg_.n_head);
    }
  }
  auto [s2, h2] = add_norm(s, linear(att, compute(b.proj_w)), b.ln2_w, b.ln2_b, b.proj_b);
  if (!cfg_.fused_ops) return {s2, affine(gelu_primitive(affine(h2, b.fc_w, b.fc_b)), b.out_w, b.out_b)};
  Tensor m = mlp(h2, compute(b.fc_w), compute(b.fc_b), compute(b.out_w), compute(b.out_b));
  return {s2, m};
}

Tensor Gpt::hidden(const Tensor& idx, Tensor& wte, KvCache* cache) const {
  const int64_t first = cache ? cache->length() : 0;
  check_ids(idx, first);
  const int64_t T = idx.size(1);
  autograd::RecomputeGuard recompute(recompute_);
  enter(0);
  wte = compute(wte_);
  Tensor pos = arange(static_cast<double>(first), static_cast<double>(first + T), 1.0,
                      TensorOptions{DType::I32, device()});
  // The residual stream is st.x + st.d: d, the positions here, is added by
  // the next LayerNorm.
  Residual st{embedding(wte, idx), embedding(compute(wpe_), pos)};
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const int unit = static_cast<int>(l) + 1;
    ProfileScope prof("block");
    enter(unit);
    if (recompute_ == Recompute::Full && !cache) {
      // A checkpointed block keeps one tensor, the stream: the add at its end
      // is an op of its own (Note [Residual into LayerNorm] in gpt.h).
      const Tensor x = st.d.defined() ? add(st.x, st.d) : st.x;
      st = {autograd::checkpoint(
                [this, l](const Tensor& in) {
                  const Residual out = block(l, in, Tensor(), nullptr);
                  return add(out.x, out.d);
                },
                x),
            Tensor()};
    } else {
      st = block(l, st.x, st.d, cache);
    }
    const std::vector<Tensor> out = leave(unit, {st.x, st.d});
    st = {out[0], out[1]};
  }
  ProfileScope prof("final_norm");
  return add_norm(st.x, st.d, lnf_w_, lnf_b_).out;
}

}  // namespace bt::nn
