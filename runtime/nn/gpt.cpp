#include "runtime/nn/gpt.h"

#include <cmath>

#include "kernels/common/error.h"
#include "runtime/autograd/checkpoint.h"
#include "runtime/core/profiler.h"
#include "runtime/ops/attention.h"
#include "runtime/ops/cross_entropy.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/embedding.h"
#include "runtime/ops/layernorm.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/mlp.h"

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

std::vector<Tensor> Gpt::parameters() const {
  std::vector<Tensor> out;
  for (const auto& [name, t] : params_) out.push_back(t);
  return out;
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

Tensor Gpt::block(const Block& b, Tensor x) const {
  Tensor qkv =
      linear(layer_norm(x, compute(b.ln1_w), compute(b.ln1_b)), compute(b.attn_w), compute(b.attn_b));
  Tensor att;
  {
    ProfileScope prof_attn("attention");
    att = causal_self_attention(qkv, cfg_.n_head);  // [B, T, 3C] -> [B, T, C], heads read and merged in place
  }
  x = add(x, linear(att, compute(b.proj_w), compute(b.proj_b)));
  Tensor h = layer_norm(x, compute(b.ln2_w), compute(b.ln2_b));
  return add(x, mlp(h, compute(b.fc_w), compute(b.fc_b), compute(b.out_w), compute(b.out_b)));
}

Tensor Gpt::forward(const Tensor& idx) const {
  BT_CHECK(idx.dim() == 2 && idx.dtype() == DType::I32, "Gpt::forward: token ids must be i32 [B, T], got ",
           idx.dtype(), " ", shape_str(idx.shape()));
  const int64_t T = idx.size(1);
  BT_CHECK(T >= 1 && T <= cfg_.seq_len, "Gpt::forward: sequence length ", T,
           " is outside [1, model.seq_len=", cfg_.seq_len, "]");
  BT_CHECK(idx.device() == device_, "Gpt::forward: token ids are on ", idx.device(), " but the model is on ",
           device_);
  autograd::RecomputeGuard recompute(recompute_);
  if (source_) source_->enter(0);
  const Tensor wte = compute(wte_);
  Tensor pos = arange(T, TensorOptions{DType::I32, device_});
  Tensor x = add(embedding(wte, idx), embedding(compute(wpe_), pos));
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const int unit = static_cast<int>(l) + 1;
    ProfileScope prof("block");
    if (source_) source_->enter(unit);
    if (recompute_ == Recompute::Full)
      x = autograd::checkpoint([this, l](const Tensor& in) { return block(blocks_[l], in); }, x);
    else
      x = block(blocks_[l], x);
    if (source_) x = source_->leave(unit, x);
  }
  ProfileScope prof("head");
  Tensor logits = linear(layer_norm(x, compute(lnf_w_), compute(lnf_b_)), wte);  // tied LM head
  return source_ ? source_->leave(0, logits) : logits;
}

Tensor Gpt::loss(const Tensor& idx, const Tensor& targets) const {
  BT_CHECK(targets.shape() == idx.shape(), "Gpt::loss: targets ", shape_str(targets.shape()),
           " must have the shape of the inputs ", shape_str(idx.shape()));
  Tensor logits = forward(idx);
  ProfileScope prof("cross_entropy");
  return cross_entropy(logits.view({-1, logits.size(-1)}), targets.reshape({-1}), cfg_.vocab_size);
}

}  // namespace bt::nn
