// Training configs: YAML + --set, presets, and errors that name the key; the
// committed configs/*.yaml load.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "launcher/config.h"
#include "tests/support/error_message.h"
#include "tests/support/paths.h"
#include "tests/support/temp_dir.h"

namespace bt::launcher {
namespace {

class ConfigTest : public ::testing::Test {
 protected:
  std::string yaml(const std::string& text) {
    const std::string p = dir_.file("c" + std::to_string(n_++) + ".yaml");
    std::ofstream(p) << text;
    return p;
  }
  std::string error_of(const std::string& path, const std::vector<std::string>& sets = {}, int world = 1) {
    return test::error_message([&] { load_train_config(path, sets, world); });
  }
  test::TempDir dir_{"bt_config"};
  int n_ = 0;
};

TEST_F(ConfigTest, EmbeddedDefaultIsTinyOnJargon) {
  const train::TrainConfig c = load_train_config("", {});
  EXPECT_EQ(c.preset, "tiny");
  EXPECT_EQ(c.model.n_layer, 4);
  EXPECT_EQ(c.model.padded_vocab(), 50304);
  EXPECT_NE(c.data.train.find("jargon"), std::string::npos);
}

TEST_F(ConfigTest, PresetThenKeysThenOverrides) {
  const std::string p = yaml("model:\n  n_layer: 2\n  preset: gpt2-124m\ntrain:\n  lr: 1e-3\n  steps: 7\n");
  const train::TrainConfig c = load_train_config(p, {"train.lr=3e-4", "data.val=", "data.shuffle=false"});
  EXPECT_EQ(c.model.n_layer, 2) << "an explicit key wins over the preset, wherever it appears";
  EXPECT_EQ(c.model.n_embd, 768);
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_DOUBLE_EQ(c.train.lr, 3e-4) << "--set wins over the file";
  EXPECT_EQ(c.data.val, "");
  EXPECT_FALSE(c.data.shuffle);
}

TEST_F(ConfigTest, ResolvedJsonHasEveryKeyAndTheDerivedOnes) {
  const train::TrainConfig c = load_train_config("", {"train.batch_size=32", "train.micro_batch=8"});
  const auto j = nlohmann::json::parse(config_to_json(c));
  EXPECT_EQ(j["model"]["padded_vocab"], 50304);
  EXPECT_EQ(j["train"]["grad_accum"], 4);
  EXPECT_EQ(j["train"]["lr"], 2e-3);
  EXPECT_EQ(j["data"]["shuffle"], true);
  EXPECT_EQ(j["model"]["preset"], "tiny");
}

TEST_F(ConfigTest, UnknownKeysAreNamedWithASuggestion) {
  const std::string e = error_of(yaml("train:\n  lrr: 1\n"));
  EXPECT_NE(e.find("unknown config key 'train.lrr'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'train.lr'"), std::string::npos) << e;
  EXPECT_NE(error_of("", {"model.layers=3"}).find("'model.layers' in --set model.layers=3"),
            std::string::npos);
  EXPECT_NE(error_of(yaml("optim:\n  lr: 1\n")).find("unknown config section 'optim'"), std::string::npos);
}

// A removed key is named with the reason it went, in a file and in --set,
// whatever its value; it is never suggested for a typo.
TEST_F(ConfigTest, RetiredKeysSayWhyTheyWent) {
  const std::string p = yaml("train:\n  steps: 3\n  deterministic: true\n");
  std::string e = error_of(p);
  EXPECT_NE(e.find("config key 'train.deterministic' in '" + p + "' was removed"), std::string::npos) << e;
  EXPECT_NE(e.find("always bitwise reproducible"), std::string::npos) << e;
  EXPECT_NE(e.find("Note [Deterministic by construction]"), std::string::npos) << e;
  EXPECT_NE(e.find("remove the key"), std::string::npos) << e;
  for (const char* set : {"train.deterministic=true", "train.deterministic=false"}) {
    e = error_of("", {set});
    EXPECT_NE(e.find(std::string("config key 'train.deterministic' in --set ") + set + " was removed"),
              std::string::npos)
        << e;
  }
  e = error_of("", {"train.determinstic=true"});
  EXPECT_NE(e.find("unknown config key 'train.determinstic'"), std::string::npos) << e;
  EXPECT_EQ(e.find("did you mean 'train.deterministic'"), std::string::npos) << e;
}

TEST_F(ConfigTest, WrongTypesAreNamed) {
  std::string e = error_of(yaml("train:\n  steps: many\n"));
  EXPECT_NE(e.find("'train.steps'"), std::string::npos) << e;
  EXPECT_NE(e.find("must be an integer, got 'many'"), std::string::npos) << e;
  e = error_of("", {"train.steps=2.5"});
  EXPECT_NE(e.find("must be an integer"), std::string::npos) << e;
  e = error_of("", {"train.seed=-1"});
  EXPECT_NE(e.find("non-negative integer"), std::string::npos) << e;
  e = error_of("", {"train.lr=fast"});
  EXPECT_NE(e.find("'train.lr'"), std::string::npos) << e;
  e = error_of("", {"data.shuffle=maybe"});
  EXPECT_NE(e.find("true or false"), std::string::npos) << e;
  e = error_of(yaml("train:\n  lr: [1, 2]\n"));
  EXPECT_NE(e.find("single value"), std::string::npos) << e;
  EXPECT_EQ(load_train_config("", {"train.steps=1e3"}).train.steps, 1000);
}

// What libFuzzer found (tests/fuzz/corpus/config/regression_*): keys that are
// not words threw yaml-cpp's exception rather than naming the key; a value
// JSON or YAML could not hold threw when the resolved config was written, or
// did not read back; and an infinite learning rate was accepted.
TEST_F(ConfigTest, ValuesThatCannotBeWrittenBackAreNamed) {
  std::string e = error_of(yaml("train:\n  ? [a, b]\n  : 1\n"));
  EXPECT_NE(e.find("config keys of section 'train'"), std::string::npos) << e;
  e = error_of(yaml("? {model: 1}\n: 2\n"));
  EXPECT_NE(e.find("config section names"), std::string::npos) << e;
  // A byte that is not UTF-8, a control character, two noncharacters.
  for (const std::string bad : {"a\xff"
                                "b",
                                "\"\\x01\"", "\"\\uFFFE\"", "\"\\U0007FFFF\""}) {
    e = error_of("", {"train.sample_prompt=" + bad});
    EXPECT_NE(e.find("'train.sample_prompt'"), std::string::npos) << e;
    EXPECT_NE(e.find("must be printable UTF-8 text"), std::string::npos) << e;
  }
  EXPECT_EQ(load_train_config("", {"train.sample_prompt=\"Caf\u00e9\\n\\ttab\""}).train.sample_prompt,
            "Caf\u00e9\n\ttab");
  for (const char* inf : {"train.lr=.inf", "train.grad_clip=-.inf", "train.eps=.nan"}) {
    e = error_of("", {inf});
    EXPECT_NE(e.find("must be a finite number"), std::string::npos) << inf << ": " << e;
  }
}

TEST_F(ConfigTest, ImpossibleValuesAreNamed) {
  std::string e = error_of("", {"train.batch_size=0"});
  EXPECT_NE(e.find("train.batch_size must be > 0"), std::string::npos) << e;
  // Note [Batch split]: a micro-batch that does not fit is lowered, and the
  // resolved config says what the job runs for its rank count.
  const train::TrainConfig c = load_train_config("", {"train.batch_size=10", "train.micro_batch=4"});
  EXPECT_EQ(c.train.micro_batch, 4);
  const nlohmann::json j = nlohmann::json::parse(config_to_json(c, 1));
  EXPECT_EQ(j["train"]["micro_batch"], 2);
  EXPECT_EQ(j["train"]["grad_accum"], 5);
  EXPECT_EQ(nlohmann::json::parse(config_to_json(c, 5))["train"]["micro_batch"], 2);
  EXPECT_EQ(nlohmann::json::parse(config_to_json(c, 2))["train"]["micro_batch"], 1);
  e = error_of("", {"train.batch_size=10", "train.micro_batch=4"}, 4);
  EXPECT_NE(e.find("train.batch_size (10) cannot be split over 4 ranks"), std::string::npos) << e;
  e = error_of("", {"model.preset=gpt9"});
  EXPECT_NE(e.find("unknown preset 'gpt9'"), std::string::npos) << e;
  e = error_of("", {"model.n_head=5"});
  EXPECT_NE(e.find("model.n_head"), std::string::npos) << e;
  e = error_of("", {"train.device=tpu"});
  EXPECT_NE(e.find("train.device"), std::string::npos) << e;
  e = error_of("", {"train.warmup_steps=-3"});
  EXPECT_NE(e.find("train.warmup_steps must be >= 0"), std::string::npos) << e;
}

// model.arch alone picks its family's small preset; with a preset of another
// family it is an error naming both; the llama keys reach the model, and an
// invalid combination names its keys.
TEST_F(ConfigTest, ModelArchPicksTheFamily) {
  train::TrainConfig c = load_train_config("", {"model.arch=llama"});
  EXPECT_EQ(c.preset, "llama-tiny");
  EXPECT_EQ(c.model.arch, "llama");
  EXPECT_EQ(c.model.kv_heads(), 2);
  EXPECT_FALSE(c.model.tie_embeddings);
  c = load_train_config(yaml("model:\n  preset: llama-150m\n  n_kv_head: 12\n  rope_theta: 500000\n"), {});
  EXPECT_EQ(c.model.n_kv_head, 12);
  EXPECT_EQ(c.model.rope_theta, 500000.0);
  EXPECT_EQ(c.model.n_embd, 768);
  EXPECT_EQ(load_train_config("", {"model.preset=llama-tiny", "model.arch=llama"}).model.n_layer, 4);
  std::string e = error_of("", {"model.preset=gpt2-124m", "model.arch=llama"});
  EXPECT_NE(e.find("model.arch=llama (in --set model.arch=llama) does not match model.preset=gpt2-124m"),
            std::string::npos)
      << e;
  e = error_of("", {"model.arch=rwkv"});
  EXPECT_NE(e.find("unknown architecture 'rwkv'; choose one of: gpt2, llama"), std::string::npos) << e;
  e = error_of("", {"model.arch=llama", "model.n_kv_head=3"});
  EXPECT_NE(e.find("model.n_kv_head (3) must divide model.n_head (4)"), std::string::npos) << e;
  e = error_of("", {"model.n_kv_head=2"});
  EXPECT_NE(e.find("model.n_kv_head (2) applies to model.arch=llama"), std::string::npos) << e;
  e = error_of("", {"train.compile=maybe"});
  EXPECT_NE(e.find("train.compile must be auto, true or false"), std::string::npos) << e;
  // train.compile=auto: on for llama on CUDA only.
  EXPECT_TRUE(load_train_config("", {"model.arch=llama"}).compile_on(true));
  EXPECT_FALSE(load_train_config("", {"model.arch=llama"}).compile_on(false));
  EXPECT_FALSE(load_train_config("", {}).compile_on(true));
  EXPECT_TRUE(load_train_config("", {"train.compile=true"}).compile_on(false));
}

TEST_F(ConfigTest, EveryPrecisionParsesAndABadOneListsThem) {
  for (const char* p : {"fp32", "tf32", "fp32x3", "bf16"}) {
    EXPECT_EQ(load_train_config("", {std::string("train.precision=") + p}).train.precision, p);
    EXPECT_EQ(load_train_config(yaml(std::string("train:\n  precision: ") + p + "\n"), {}).train.precision,
              p);
  }
  const std::string e = error_of("", {"train.precision=fp32x4"});
  EXPECT_NE(e.find("train.precision"), std::string::npos) << e;
  EXPECT_NE(e.find("'fp32x4'"), std::string::npos) << e;
  EXPECT_NE(e.find("use fp32, tf32, fp32x3 or bf16"), std::string::npos) << e;
}

TEST_F(ConfigTest, BadFilesAreNamed) {
  EXPECT_NE(error_of(dir_.file("missing.yaml")).find("missing.yaml' does not exist"), std::string::npos);
  const std::string bad = yaml("train: [unclosed\n");
  EXPECT_NE(error_of(bad).find("is not valid YAML"), std::string::npos);
  EXPECT_NE(error_of("", {"train.lr"}).find("section.key=value"), std::string::npos);
}

TEST_F(ConfigTest, CommittedConfigsLoad) {
  for (const char* name : {"tiny", "gpt2-124m", "llama-tiny", "llama-150m"}) {
    const train::TrainConfig c = load_train_config(test::source_dir() + "/configs/" + name + ".yaml", {});
    EXPECT_EQ(c.preset, name);
  }
  const train::TrainConfig tiny = load_train_config(test::source_dir() + "/configs/tiny.yaml", {});
  const train::TrainConfig def = load_train_config("", {});
  EXPECT_EQ(config_to_json(tiny), config_to_json(def))
      << "configs/tiny.yaml must spell out the embedded default";
}

}  // namespace
}  // namespace bt::launcher
