#include "runtime/nn/model_config.h"

#include <nlohmann/json.hpp>

#include "kernels/common/error.h"
#include "runtime/nn/registry.h"

namespace bt::nn {

void ModelConfig::validate(const std::string& where) const {
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
  BT_CHECK(n_kv_head >= 0, where, ".n_kv_head must be >= 0 (0: one per head), got ", n_kv_head);
  BT_CHECK(ffn_hidden >= 0, where, ".ffn_hidden must be >= 0 (0: the family's default), got ", ffn_hidden);
  BT_CHECK(norm_eps > 0, where, ".norm_eps must be > 0, got ", norm_eps);
  BT_CHECK(rope_theta > 0, where, ".rope_theta must be > 0, got ", rope_theta);
  family(arch).validate(*this, where);
}

int64_t ModelConfig::num_params() const { return family(arch).num_params(*this); }

double ModelConfig::flops_per_token(int64_t T) const { return family(arch).flops_per_token(*this, T); }

namespace {

/// Calls f(key, field) for every field of `c`, in the order files keep them.
template <typename Config, typename F>
void for_each_field(Config& c, F&& f) {
  f("arch", c.arch);
  f("n_layer", c.n_layer);
  f("n_head", c.n_head);
  f("n_embd", c.n_embd);
  f("seq_len", c.seq_len);
  f("vocab_size", c.vocab_size);
  f("n_kv_head", c.n_kv_head);
  f("ffn_hidden", c.ffn_hidden);
  f("rope_theta", c.rope_theta);
  f("norm_eps", c.norm_eps);
  f("tie_embeddings", c.tie_embeddings);
  f("fused_ops", c.fused_ops);
}

}  // namespace

std::string model_config_json(const ModelConfig& c) {
  nlohmann::ordered_json j;
  for_each_field(c, [&](const char* key, const auto& field) { j[key] = field; });
  j["padded_vocab"] = c.padded_vocab();
  return j.dump();
}

ModelConfig model_config_from_json(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    BT_FAIL(where, ": the model config is not JSON (", e.what(), ")");
  }
  BT_CHECK(j.is_object(), where, ": the model config is not a JSON object");
  ModelConfig c;
  for_each_field(c, [&](const char* key, auto& field) {
    const auto it = j.find(key);
    if (it == j.end()) return;
    try {
      it->get_to(field);
    } catch (const nlohmann::json::exception&) {
      BT_FAIL(where, ": model key '", key, "' has a value of the wrong type (", it->dump(), ")");
    }
  });
  return c;
}

}  // namespace bt::nn
