// `blutrain train` and `blutrain sample`, run as the built executable on
// synthetic shards: metrics JSONL, weights files, resuming from weights, and
// bad input that must end in a clear message and a non-zero exit.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include "tests/support/fetched_data.h"
#include "tests/support/files.h"
#include "tests/support/paths.h"
#include "tests/support/temp_dir.h"
#include "tests/support/token_data.h"

namespace bt {
namespace {

struct Result {
  int status;
  std::string output;
};

Result run(const std::string& args) {
  const std::string cmd = test::blutrain_exe() + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  Result r{-1, ""};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

class TrainCli : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string d = dir_.path().string();
    const std::string train = test::write_token_shards(d, "train", 1, 4000, 64, 1);
    const std::string val = test::write_token_shards(d, "val", 1, 600, 64, 2);
    base_ =
        "train --set model.n_layer=1 --set model.n_head=2 --set model.n_embd=32 --set model.seq_len=16 "
        "--set model.vocab_size=64 --set train.device=cpu --set train.batch_size=8 --set train.micro_batch=4 "
        "--set train.lr=3e-3 --set train.warmup_steps=2 --set train.eval_batches=2 --set "
        "train.sample_tokens=0 "
        "--set 'data.train=" +
        train + "' --set 'data.val=" + val + "'";
  }
  test::TempDir dir_{"bt_train_cli"};
  std::string base_;
};

TEST_F(TrainCli, WritesMetricsWeightsAndResolvedConfig) {
  const Result r = run(base_ + " --set train.steps=12 --set train.eval_every=5 --metrics " +
                       dir_.file("m.jsonl") + " --save-init " + dir_.file("w0.h5") + " --save-weights " +
                       dir_.file("w.h5") + " --resolved-config " + dir_.file("cfg.json"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("step 12/12"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("val loss"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("done: 12 steps"), std::string::npos) << r.output;
  const auto m = read_jsonl(dir_.file("m.jsonl"));
  ASSERT_EQ(m.size(), 12u);
  for (size_t i = 0; i < m.size(); ++i) {
    EXPECT_EQ(m[i]["step"], i + 1);
    for (const char* k : {"loss", "lr", "grad_norm", "tokens_per_s", "peak_mem_bytes"})
      EXPECT_TRUE(m[i].contains(k)) << k << " missing at step " << i + 1;
    EXPECT_EQ(m[i].contains("val_loss"), i + 1 == 5 || i + 1 == 10 || i + 1 == 12) << "step " << i + 1;
  }
  EXPECT_LT(m.back()["loss"].get<double>(), m.front()["loss"].get<double>() - 0.3);
  EXPECT_TRUE(std::filesystem::exists(dir_.file("w0.h5")));
  EXPECT_TRUE(std::filesystem::exists(dir_.file("w.h5")));
  const auto cfg = nlohmann::json::parse(std::ifstream(dir_.file("cfg.json")));
  EXPECT_EQ(cfg["train"]["grad_accum"], 2);
  EXPECT_EQ(cfg["model"]["padded_vocab"], 128);
}

TEST_F(TrainCli, InitWeightsReproduceTheSeededRun) {
  ASSERT_EQ(run(base_ + " --set train.steps=3 --metrics " + dir_.file("a.jsonl") + " --save-init " +
                dir_.file("w0.h5"))
                .status,
            0);
  // Same run from the saved init, with a different seed for the init only
  // (the data order is unshuffled so it does not depend on the seed).
  const Result r =
      run(base_ + " --set train.steps=3 --set data.shuffle=false --metrics " + dir_.file("b.jsonl") +
          " --init-weights " + dir_.file("w0.h5") + " --set train.seed=5");
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_EQ(
      run(base_ + " --set train.steps=3 --set data.shuffle=false --metrics " + dir_.file("c.jsonl")).status,
      0);
  const auto b = read_jsonl(dir_.file("b.jsonl")), c = read_jsonl(dir_.file("c.jsonl"));
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(b[i]["loss"], c[i]["loss"]) << "step " << i + 1;
}

TEST_F(TrainCli, BadInputEndsInAClearError) {
  auto expect_error = [&](const std::string& args, const std::string& needle) {
    const Result r = run(args);
    EXPECT_EQ(r.status, 1) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
  };
  expect_error(base_ + " --set train.lr_peak=1", "unknown config key 'train.lr_peak'");
  expect_error(base_ + " --set 'data.train=" + dir_.file("none_*.bin") + "'", "none_*.bin");
  expect_error("train --config " + dir_.file("nope.yaml"), "nope.yaml' does not exist");
  expect_error(base_ + " --init-weights " + dir_.file("missing.h5"), "missing.h5");
  expect_error(base_ + " --metrics /nonexistent/dir/m.jsonl", "/nonexistent/dir/m.jsonl");
  // Weights of another shape are refused, naming the mismatch.
  ASSERT_EQ(run(base_ + " --set train.steps=1 --save-weights " + dir_.file("w.h5")).status, 0);
  expect_error(base_ + " --set model.n_embd=64 --init-weights " + dir_.file("w.h5"), "n_embd");
  expect_error("sample", "--weights FILE is required");
  expect_error("sample --weights " + dir_.file("w.h5") + " --tokenizer " + dir_.file("no_tokenizer"),
               "no_tokenizer");
}

// Note [Batch split]: a micro-batch that does not split the batch is lowered,
// and the header says so once.
TEST_F(TrainCli, AMicroBatchThatDoesNotFitIsLoweredAndSaid) {
  const Result r = run(base_ + " --set train.steps=1 --set train.micro_batch=3 --resolved-config " +
                       dir_.file("cfg.json"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(
      r.output.find("note: train.micro_batch 3 does not split train.batch_size 8: running micro-batches "
                    "of 2 (the largest that does), 4 per rank per step"),
      std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("(4 micro-batches of 2)"), std::string::npos) << r.output;
  std::ifstream f(dir_.file("cfg.json"));
  const nlohmann::json cfg = nlohmann::json::parse(f);
  EXPECT_EQ(cfg["train"]["micro_batch"], 2);
  EXPECT_EQ(cfg["train"]["grad_accum"], 4);
}

// Note [Fail fast]: inputs needed after training are checked before step 1.
TEST_F(TrainCli, InputsNeededLaterAreCheckedBeforeTheFirstStep) {
  auto expect_early_error = [&](const std::string& args, const std::string& needle) {
    const Result r = run(args);
    EXPECT_EQ(r.status, 1) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("step 1"), std::string::npos) << "trained before failing:\n" << r.output;
  };
  const std::string no_tok = dir_.file("no_tokenizer");
  const std::string sampling = base_ + " --set train.sample_tokens=5 --set 'data.tokenizer=" + no_tok + "'";
  expect_early_error(sampling, "data.tokenizer '" + no_tok + "'");
  expect_early_error(sampling, "train.sample_tokens=0");
  // Without the sample the same run trains and ends well.
  const Result plain = run(base_ + " --set train.steps=2 --set 'data.tokenizer=" + no_tok + "'");
  EXPECT_EQ(plain.status, 0) << plain.output;
  EXPECT_NE(plain.output.find("done: 2 steps"), std::string::npos) << plain.output;

  expect_early_error(base_ + " --save-weights " + dir_.file("missing_dir/w.h5"),
                     "train.save_weights (--save-weights) '" + dir_.file("missing_dir/w.h5") + "'");
  expect_early_error(base_ + " --save-weights " + dir_.path().string(), "is a folder");
  std::ofstream(dir_.file("a_file")) << "x";
  expect_early_error(base_ + " --set checkpoint.dir=" + dir_.file("a_file") + "/ckpt",
                     "checkpoint.dir '" + dir_.file("a_file") + "/ckpt' cannot be created");
  expect_early_error(base_ + " --set train.resume=" + dir_.file("nowhere"),
                     "train.resume: '" + dir_.file("nowhere") + "' does not exist");
  std::filesystem::create_directories(dir_.file("empty_root"));
  expect_early_error(base_ + " --set train.resume=" + dir_.file("empty_root"),
                     "holds no complete checkpoint");
}

TEST_F(TrainCli, SampleFromSavedWeights) {
  const std::string tok = test::data_dir() + "/tokenizer";
  BT_NEED_FETCHED(tok + "/encoder.json", "tokenizer");
  ASSERT_EQ(run(base_ + " --set train.steps=2 --save-weights " + dir_.file("w.h5")).status, 0);
  const Result r =
      run("sample --weights " + dir_.file("w.h5") + " --tokenizer " + tok + " --tokens 20 --prompt '!'");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("---- sample (20 tokens"), std::string::npos) << r.output;
  const Result again =
      run("sample --weights " + dir_.file("w.h5") + " --tokenizer " + tok + " --tokens 20 --prompt '!'");
  EXPECT_EQ(again.output, r.output) << "sampling with the same seed must repeat";
}

// A Llama's weights file names its family: it initializes a Llama run, a
// GPT-2 run refuses it by architecture, `sample` rebuilds the Llama from it,
// and a Llama checkpoint exports to HDF5 but not to llm.c's GPT-2 format.
// Note [Files confined to their checkpoint]: an index edited to name a file
// outside its folder fails `ckpt verify`, and resume falls back to the
// checkpoint before it, moving the bad one aside so that its step can be
// saved again.
TEST_F(TrainCli, AnIndexPointingOutsideItsFolderIsRefusedAndResumeFallsBack) {
  const std::string ck = dir_.file("ck");
  Result r = run(base_ + " --set train.steps=4 --set checkpoint.every=2 --set checkpoint.dir=" + ck);
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string index = ck + "/step_00000004/index.json";
  nlohmann::json j = nlohmann::json::parse(test::read_file(index));
  j["tensors"].begin().value()["pieces"][0]["file"] = "../../../../etc/passwd";
  std::ofstream(index, std::ios::trunc) << j.dump(1);
  r = run("ckpt verify " + ck + "/step_00000004");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(
      r.output.find("names the file '../../../../etc/passwd', which is not a plain file name inside the "
                    "checkpoint's folder"),
      std::string::npos)
      << r.output;
  r = run(base_ + " --set train.steps=6 --set checkpoint.every=2 --set checkpoint.dir=" + ck +
          " --set train.resume=auto");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("checkpoint " + ck + "/step_00000004 is unusable"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resumed from " + ck + "/step_00000002"), std::string::npos) << r.output;
  // The run saved step 4 again: the unusable one was kept, moved aside.
  EXPECT_NE(r.output.find("moved " + ck + "/step_00000004 aside to " + ck + "/step_00000004.unusable"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(std::filesystem::exists(ck + "/step_00000004.unusable/index.json"));
  r = run("ckpt verify --all " + ck);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("3 checkpoint(s), 0 with problems"), std::string::npos) << r.output;
}

TEST_F(TrainCli, LlamaWeightsCheckpointsAndSamples) {
  const std::string llama = base_ + " --set model.arch=llama --set model.n_head=4 --set model.n_kv_head=2";
  ASSERT_EQ(run(llama + " --set train.steps=2 --save-weights " + dir_.file("l.h5") +
                " --set checkpoint.dir=" + dir_.file("ck"))
                .status,
            0);
  Result r = run(llama + " --set train.steps=1 --init-weights " + dir_.file("l.h5"));
  EXPECT_EQ(r.status, 0) << r.output;
  r = run(base_ + " --set train.steps=1 --init-weights " + dir_.file("l.h5"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("it holds a llama model, and model.arch is gpt2"), std::string::npos) << r.output;
  r = run("ckpt export " + dir_.file("ck") + " " + dir_.file("e.h5") + " --llmc " + dir_.file("e.bin"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("llm.c's format holds GPT-2 models only"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir_.file("e.h5"))) << "nothing is written before the refusal";
  r = run("ckpt export " + dir_.file("ck") + " " + dir_.file("e.h5"));
  ASSERT_EQ(r.status, 0) << r.output;
  r = run(llama + " --set train.steps=1 --init-weights " + dir_.file("e.h5"));
  EXPECT_EQ(r.status, 0) << "the export initializes a Llama run\n" << r.output;

  const std::string tok = test::data_dir() + "/tokenizer";
  BT_NEED_FETCHED(tok + "/encoder.json", "tokenizer");
  r = run("sample --weights " + dir_.file("l.h5") + " --tokenizer " + tok + " --tokens 12 --prompt '!'");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("---- sample (12 tokens"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace bt
