#include "launcher/model_file.h"

#include <map>

#include "checkpoint/weights.h"
#include "kernels/common/error.h"

namespace bt::launcher {
namespace {

std::map<std::string, int64_t> attrs_of(const nn::GptConfig& c) {
  return {{"n_layer", c.n_layer}, {"n_head", c.n_head},         {"n_embd", c.n_embd},
          {"seq_len", c.seq_len}, {"vocab_size", c.vocab_size}, {"padded_vocab", c.padded_vocab()}};
}

}  // namespace

void save_model(const std::string& path, const nn::Gpt& m) {
  save_weights(path, m.named_parameters(), attrs_of(m.config()));
}

void load_model_into(const std::string& path, nn::Gpt& m) {
  const WeightFile f = load_weights(path);
  try {
    check_weight_attrs(f, attrs_of(m.config()));
    load_into(f, m.named_parameters());
  } catch (const Error& e) {
    BT_FAIL("weights file '", path, "' does not fit this model: ", e.what());
  }
}

std::unique_ptr<nn::Gpt> load_model(const std::string& path, const Device& device) {
  const WeightFile f = load_weights(path);
  nn::GptConfig c;
  auto get = [&](const char* key) {
    const auto it = f.attrs.find(key);
    BT_CHECK(it != f.attrs.end(), "weights file '", path, "' has no '", key,
             "' attribute, so its model shape is unknown; was it written by blutrain train?");
    return it->second;
  };
  c.n_layer = get("n_layer");
  c.n_head = get("n_head");
  c.n_embd = get("n_embd");
  c.seq_len = get("seq_len");
  c.vocab_size = get("vocab_size");
  c.validate("weights file '" + path + "'");
  auto m = std::make_unique<nn::Gpt>(c, device, 0);
  try {
    load_into(f, m->named_parameters());
  } catch (const Error& e) {
    BT_FAIL("weights file '", path, "': ", e.what());
  }
  return m;
}

}  // namespace bt::launcher
