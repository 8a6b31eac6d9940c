#include "launcher/model_file.h"

#include <map>

#include "checkpoint/weights.h"
#include "kernels/common/error.h"
#include "runtime/nn/registry.h"

namespace bt::launcher {
namespace {

/// The config a weights file describes (Note in model_file.h).
nn::ModelConfig config_of(const WeightFile& f) {
  const std::string where = "weights file '" + f.path + "'";
  const auto text = f.text_attrs.find("model");
  if (text != f.text_attrs.end()) return nn::model_config_from_json(text->second, where);
  nn::ModelConfig c;  // written before model.arch: GPT-2
  auto get = [&](const char* key) {
    const auto it = f.attrs.find(key);
    BT_CHECK(it != f.attrs.end(), where, " has no '", key,
             "' attribute, so its model shape is unknown; was it written by blutrain train?");
    return it->second;
  };
  c.n_layer = get("n_layer");
  c.n_head = get("n_head");
  c.n_embd = get("n_embd");
  c.seq_len = get("seq_len");
  c.vocab_size = get("vocab_size");
  return c;
}

}  // namespace

void save_model(const std::string& path, const nn::Model& m) {
  save_weights(path, m.named_parameters(), m.shape_attrs(), {{"model", nn::model_config_json(m.config())}});
}

void load_model_into(const std::string& path, nn::Model& m) {
  const WeightFile f = load_weights(path);
  try {
    const auto text = f.text_attrs.find("model");
    const std::string arch =
        text == f.text_attrs.end() ? "gpt2" : nn::model_config_from_json(text->second, "the file").arch;
    BT_CHECK(arch == m.arch(), "it holds a ", arch, " model, and model.arch is ", m.arch());
    check_weight_attrs(f, m.shape_attrs());
    load_into(f, m.named_parameters());
  } catch (const Error& e) {
    BT_FAIL("weights file '", path, "' does not fit this model: ", e.what());
  }
}

std::unique_ptr<nn::Model> load_model(const std::string& path, const Device& device) {
  const WeightFile f = load_weights(path);
  const nn::ModelConfig c = config_of(f);
  c.validate("weights file '" + path + "': model");
  auto m = nn::family(c.arch).make(c, device, 0);
  try {
    check_weight_attrs(f, m->shape_attrs());
    load_into(f, m->named_parameters());
  } catch (const Error& e) {
    BT_FAIL("weights file '", path, "': ", e.what());
  }
  return m;
}

}  // namespace bt::launcher
