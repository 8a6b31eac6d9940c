// Note [Fail fast]: the checks a run makes before its first step, one by one
// (tests/launcher/test_train_cli.cpp runs them through `blutrain train`).
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "launcher/preflight.h"
#include "runtime/nn/registry.h"
#include "tests/support/error_message.h"
#include "tests/support/temp_dir.h"

namespace bt::launcher {
namespace {

TEST(Preflight, ACheckpointIsTheParametersAndBothMomentsInF32) {
  const nn::ModelConfig tiny = nn::model_preset("tiny");
  EXPECT_EQ(checkpoint_bytes(tiny), static_cast<uint64_t>(tiny.num_params()) * 12);
  EXPECT_GT(checkpoint_bytes(nn::model_preset("gpt2-124m")), 1'400'000'000u);  // 124M x 12 bytes
}

TEST(Preflight, TooLittleRoomForACheckpointNamesTheFolderAndTheSizes) {
  check_room("ck", 1000, 1100);  // a tenth of slack fits
  const std::string e = test::error_message([] { check_room("/mnt/ck", 1u << 30, 100u << 20); });
  EXPECT_NE(e.find("checkpoint.dir '/mnt/ck' has 100 MiB free"), std::string::npos) << e;
  EXPECT_NE(e.find("takes about 1.00 GiB"), std::string::npos) << e;
  EXPECT_NE(e.find("checkpoint.keep_last"), std::string::npos) << e;
}

TEST(Preflight, AnOutputFileNeedsAWritableFolder) {
  test::TempDir dir{"bt_preflight"};
  check_writable_target(dir.file("w.h5"), "train.save_weights");
  check_writable_target("", "train.save_weights");  // none asked for
  EXPECT_FALSE(std::filesystem::exists(dir.file("w.h5"))) << "the check leaves no file behind";
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  std::string e =
      test::error_message([&] { check_writable_target(dir.file("no/w.h5"), "train.save_weights"); });
  EXPECT_NE(e.find("train.save_weights '" + dir.file("no/w.h5") + "': its folder '" + dir.file("no") +
                   "' does not exist"),
            std::string::npos)
      << e;
  e = test::error_message([&] { check_writable_target(dir.path().string(), "--save-init"); });
  EXPECT_NE(e.find("is a folder"), std::string::npos) << e;
}

TEST(Preflight, TheCheckpointFolderIsMadeAndProbed) {
  test::TempDir dir{"bt_preflight"};
  train::TrainConfig c;
  c.checkpoint.dir = dir.file("a/b/ck");
  check_run_inputs(c);
  EXPECT_TRUE(std::filesystem::is_directory(c.checkpoint.dir));
  EXPECT_TRUE(std::filesystem::is_empty(c.checkpoint.dir)) << "the write probe is removed";
  std::ofstream(dir.file("file")) << "x";
  c.checkpoint.dir = dir.file("file");
  const std::string e = test::error_message([&] { check_run_inputs(c); });
  EXPECT_NE(e.find("checkpoint.dir '" + dir.file("file") + "' cannot be created"), std::string::npos) << e;
}

TEST(Preflight, AResumeTargetMustBeACheckpointOrARootWithOne) {
  test::TempDir dir{"bt_preflight"};
  train::TrainConfig c;
  c.train.resume = dir.file("none_here");
  std::string e = test::error_message([&] { check_run_inputs(c); });
  EXPECT_NE(e.find("train.resume: '" + dir.file("none_here") + "' does not exist"), std::string::npos) << e;
  c.train.resume = dir.path().string();
  e = test::error_message([&] { check_run_inputs(c); });
  EXPECT_NE(e.find("holds no complete checkpoint"), std::string::npos) << e;
  c.train.resume = "none";
  check_run_inputs(c);
}

}  // namespace
}  // namespace bt::launcher
