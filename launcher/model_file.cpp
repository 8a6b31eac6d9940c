#include "launcher/model_file.h"

#include <map>

#include "checkpoint/weights.h"
#include "kernels/common/error.h"

namespace bt::launcher {

void save_model(const std::string& path, const nn::Model& m) {
  save_weights(path, m.named_parameters(), m.shape_attrs());
}

void load_model_into(const std::string& path, nn::Model& m) {
  const WeightFile f = load_weights(path);
  try {
    check_weight_attrs(f, m.shape_attrs());
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
