#include "runtime/nn/gpt.h"

#include <cmath>

#include "kernels/common/error.h"
#include "runtime/autograd/checkpoint.h"
#include "runtime/core/precision.h"
#include "runtime/core/profiler.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/nn/attention.h"
#include "runtime/ops/nn/cross_entropy.h"
#include "runtime/ops/nn/embedding.h"
#include "runtime/ops/nn/layernorm.h"
#include "runtime/ops/nn/linear_cross_entropy.h"
#include "runtime/ops/nn/mlp.h"
#include "runtime/ops/reduce.h"

namespace bt::nn {

void GptConfig::validate(const std::string& where) const {
  auto positive = [&](const char* key, int64_t v) {
    BT_CHECK(v > 0, where, ".", key, " must be a positive integer, got ", v);
  };
  positive("n_layer", n_layer);
  positive("n_head", n_head);
  positive("n_embd", n_embd);
  positive("seq_len", seq_len);
  positive("vocab_size", vocab_size);
  BT_CHECK(n_embd % n_head == 0, where, ".n_embd (", n_embd, ") must be divisible by ", where, ".n_head (",
           n_head, ")");
  BT_CHECK(vocab_size <= 65536, where, ".vocab_size (", vocab_size,
           ") must be <= 65536: token shards store uint16 ids");
}

int64_t GptConfig::num_params() const {
  const int64_t C = n_embd;
  const int64_t per_block =
      2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C);
  return padded_vocab() * C + seq_len * C + n_layer * per_block + 2 * C;
}

double GptConfig::flops_per_token(int64_t T) const {
  return 6.0 * static_cast<double>(num_params()) + 12.0 * n_layer * n_embd * static_cast<double>(T);
}

GptConfig gpt_preset(const std::string& name) {
  GptConfig c;
  if (name == "tiny") return c;  // the defaults: 4 x 128, 4 heads, T=256
  if (name == "gpt2-124m") {
    c.n_layer = 12;
    c.n_head = 12;
    c.n_embd = 768;
    c.seq_len = 1024;
    return c;
  }
  BT_FAIL("model.preset: unknown preset '", name, "'; choose one of: tiny, gpt2-124m");
}

std::vector<std::string> gpt_preset_names() { return {"tiny", "gpt2-124m"}; }

Tensor Gpt::add_param(const std::string& name, const Shape& shape, double std, double fill, Generator& g) {
  const TensorOptions o{DType::F32, device_};
  Tensor t = std > 0 ? normal(shape, 0.0, std, o, &g) : full(shape, fill, o);
  t.requires_grad_();
  params_.emplace_back(name, t);
  return t;
}

Gpt::Gpt(const GptConfig& cfg, const Device& device, uint64_t seed) : cfg_(cfg), device_(device) {
  cfg_.validate();
  Generator g(seed);
  const int64_t C = cfg_.n_embd;
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(cfg_.n_layer));
  wte_ = add_param("wte", {cfg_.padded_vocab(), C}, 0.02, 0, g);
  wpe_ = add_param("wpe", {cfg_.seq_len, C}, 0.02, 0, g);
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    Block b;
    b.ln1_w = add_param(h + "ln_1.weight", {C}, 0, 1, g);
    b.ln1_b = add_param(h + "ln_1.bias", {C}, 0, 0, g);
    b.attn_w = add_param(h + "attn.c_attn.weight", {3 * C, C}, 0.02, 0, g);
    b.attn_b = add_param(h + "attn.c_attn.bias", {3 * C}, 0, 0, g);
    b.proj_w = add_param(h + "attn.c_proj.weight", {C, C}, proj_std, 0, g);
    b.proj_b = add_param(h + "attn.c_proj.bias", {C}, 0, 0, g);
    b.ln2_w = add_param(h + "ln_2.weight", {C}, 0, 1, g);
    b.ln2_b = add_param(h + "ln_2.bias", {C}, 0, 0, g);
    b.fc_w = add_param(h + "mlp.c_fc.weight", {4 * C, C}, 0.02, 0, g);
    b.fc_b = add_param(h + "mlp.c_fc.bias", {4 * C}, 0, 0, g);
    b.out_w = add_param(h + "mlp.c_proj.weight", {C, 4 * C}, proj_std, 0, g);
    b.out_b = add_param(h + "mlp.c_proj.bias", {C}, 0, 0, g);
    blocks_.push_back(b);
  }
  lnf_w_ = add_param("ln_f.weight", {C}, 0, 1, g);
  lnf_b_ = add_param("ln_f.bias", {C}, 0, 0, g);
}

std::map<std::string, int64_t> Gpt::shape_attrs() const {
  return {{"n_layer", cfg_.n_layer}, {"n_head", cfg_.n_head},         {"n_embd", cfg_.n_embd},
          {"seq_len", cfg_.seq_len}, {"vocab_size", cfg_.vocab_size}, {"padded_vocab", cfg_.padded_vocab()}};
}

bool Gpt::decays(const std::string& name) const {
  for (const auto& [n, t] : params_)
    if (n == name) return t.dim() >= 2;
  BT_FAIL("GPT-2 has no parameter named '", name, "'");
}

bool Gpt::keeps_f32(const std::string& name) const {
  // The primitive model casts its LayerNorm parameters like the others (Note [Primitive-op GPT]).
  return cfg_.fused_ops && (name.find(".ln_") != std::string::npos || name.rfind("ln_f.", 0) == 0);
}

std::vector<int> Gpt::param_units() const {
  std::vector<int> units;
  for (const auto& [name, t] : params_) {
    int u = 0;
    if (name.rfind("h.", 0) == 0) u = 1 + std::stoi(name.substr(2, name.find('.', 2) - 2));
    units.push_back(u);
  }
  return units;
}

/// The compute copy of a master parameter: the weight source's tensor when
/// there is one; else a recorded bf16 cast under Precision::BF16 (its
/// gradient flows back into the f32 master), else the parameter itself.
Tensor Gpt::compute(const Tensor& p) const {
  if (source_) return source_->weight(p);
  return precision() == Precision::BF16 ? p.to(DType::BF16) : p;
}

/// A LayerNorm's affine parameter: the f32 master itself under every
/// precision (Note [f32 LayerNorm parameters] in gpt.h), or the weight
/// source's tensor, which keeps it f32 as well (keeps_f32()).
Tensor Gpt::norm_param(const Tensor& p) const { return source_ ? source_->weight(p) : p; }

namespace {

constexpr double kLayerNormEps = 1e-5;

/// LayerNorm over the last dim from primitive ops (Note [Primitive-op GPT]).
Tensor layer_norm_primitive(const Tensor& x, const Tensor& w, const Tensor& b) {
  const Tensor mu = mean(x, {-1}, true);
  const Tensor xc = sub(x, mu);
  const Tensor var = mean(mul(xc, xc), {-1}, true);
  return add(mul(div(xc, sqrt(add(var, kLayerNormEps))), w), b);
}

/// GELU's tanh form, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), from primitive ops.
Tensor gelu_primitive(const Tensor& x) {
  const Tensor inner = mul(add(x, mul(mul(mul(x, x), x), 0.044715)), 0.7978845608028654);
  return mul(mul(x, 0.5), add(tanh(inner), 1.0));
}

}  // namespace

ResidualNorm Gpt::add_norm(const Tensor& x, const Tensor& d, const Tensor& w, const Tensor& b) const {
  if (!cfg_.fused_ops) {
    const Tensor s = d.defined() ? add(x, d) : x;
    return {s, layer_norm_primitive(s, compute(w), compute(b))};
  }
  if (!d.defined()) return {x, layer_norm(x, norm_param(w), norm_param(b), kLayerNormEps)};
  return add_layer_norm(x, d, norm_param(w), norm_param(b), kLayerNormEps);
}

Tensor Gpt::affine(const Tensor& x, const Tensor& w, const Tensor& bias) const {
  if (cfg_.fused_ops) return linear(x, compute(w), compute(bias));
  return add(linear(x, compute(w)), compute(bias));
}

Gpt::Residual Gpt::block(const Block& b, const Tensor& x, const Tensor& d) const {
  auto [s, h] = add_norm(x, d, b.ln1_w, b.ln1_b);
  Tensor qkv = affine(h, b.attn_w, b.attn_b);
  Tensor att;
  {
    ProfileScope prof_attn("attention");
    att = causal_self_attention(qkv, cfg_.n_head);  // [B, T, 3C] -> [B, T, C], heads read and merged in place
  }
  auto [s2, h2] = add_norm(s, affine(att, b.proj_w, b.proj_b), b.ln2_w, b.ln2_b);
  if (!cfg_.fused_ops) return {s2, affine(gelu_primitive(affine(h2, b.fc_w, b.fc_b)), b.out_w, b.out_b)};
  Tensor m = mlp(h2, compute(b.fc_w), compute(b.fc_b), compute(b.out_w), compute(b.out_b));
  return {s2, m};
}

Tensor Gpt::forward(const Tensor& idx) const {
  Tensor wte;
  const Tensor h = hidden(idx, wte);
  ProfileScope prof("head");
  Tensor logits = linear(h, wte);  // tied LM head
  return source_ ? source_->leave(0, {logits})[0] : logits;
}

Tensor Gpt::hidden(const Tensor& idx, Tensor& wte) const {
  BT_CHECK(idx.dim() == 2 && idx.dtype() == DType::I32, "Gpt::forward: token ids must be i32 [B, T], got ",
           idx.dtype(), " ", shape_str(idx.shape()));
  const int64_t T = idx.size(1);
  BT_CHECK(T >= 1 && T <= cfg_.seq_len, "Gpt::forward: sequence length ", T,
           " is outside [1, model.seq_len=", cfg_.seq_len, "]");
  BT_CHECK(idx.device() == device_, "Gpt::forward: token ids are on ", idx.device(), " but the model is on ",
           device_);
  autograd::RecomputeGuard recompute(recompute_);
  if (source_) source_->enter(0);
  wte = compute(wte_);
  Tensor pos = arange(T, TensorOptions{DType::I32, device_});
  // The residual stream is st.x + st.d: d, the positions here, is added by
  // the next LayerNorm.
  Residual st{embedding(wte, idx), embedding(compute(wpe_), pos)};
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const int unit = static_cast<int>(l) + 1;
    ProfileScope prof("block");
    if (source_) source_->enter(unit);
    if (recompute_ == Recompute::Full) {
      // A checkpointed block keeps one tensor, the stream: the add at its end
      // is an op of its own (Note [Residual into LayerNorm] in gpt.h).
      const Tensor x = st.d.defined() ? add(st.x, st.d) : st.x;
      st = {autograd::checkpoint(
                [this, l](const Tensor& in) {
                  const Residual out = block(blocks_[l], in, Tensor());
                  return add(out.x, out.d);
                },
                x),
            Tensor()};
    } else {
      st = block(blocks_[l], st.x, st.d);
    }
    if (source_) {
      const std::vector<Tensor> out = source_->leave(unit, {st.x, st.d});
      st = {out[0], out[1]};
    }
  }
  ProfileScope prof("final_norm");
  return add_norm(st.x, st.d, lnf_w_, lnf_b_).out;
}

Tensor Gpt::loss(const Tensor& idx, const Tensor& targets, float grad_hint) const {
  BT_CHECK(targets.shape() == idx.shape(), "Gpt::loss: targets ", shape_str(targets.shape()),
           " must have the shape of the inputs ", shape_str(idx.shape()));
  Tensor wte;
  const Tensor h = hidden(idx, wte);
  const int64_t chunk = lm_head_chunk_rows(cfg_.padded_vocab(), wte.dtype(), matmul_math(precision()));
  if (chunk == 0) {  // BT_HEAD_CHUNK_MIB=0: the logits whole
    Tensor logits;
    {
      ProfileScope prof("head");
      logits = linear(h, wte);
      if (source_) logits = source_->leave(0, {logits})[0];
    }
    ProfileScope prof("cross_entropy");
    Tensor flat = logits.view({-1, logits.size(-1)});
    logits = Tensor();  // the loss consumes the logits (Note [Gradient in the forward pass])
    return cross_entropy(std::move(flat), targets.reshape({-1}), cfg_.vocab_size, grad_hint);
  }
  ProfileScope prof("head_and_loss");  // Note [The LM head in row chunks]
  Tensor loss = linear_cross_entropy(h.reshape({-1, h.size(-1)}), wte, targets.reshape({-1}), cfg_.vocab_size,
                                     grad_hint, chunk);
  return source_ ? source_->leave(0, {loss})[0] : loss;
}

}  // namespace bt::nn
