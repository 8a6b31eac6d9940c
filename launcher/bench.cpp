// `blutrain bench`: training throughput and peak memory of BluTrain and of the
// PyTorch reference (bench/gpt2_ref.py), measured in the same run on the same
// token stream and model, with their ratio. The reference runs first, in its
// own process, so each side has the GPU to itself.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "launcher/cli.h"
#include "launcher/commands.h"
#include "launcher/progress.h"
#include "runtime/bt.h"
#include "runtime/core/profiler.h"
#include "runtime/data/shard.h"
#include "runtime/train/trainer.h"

namespace bt::launcher {
namespace {

struct Side {
  double tokens_per_s = 0;
  double step_ms = 0;
  uint64_t peak_mem = 0;
  std::string note;
};

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// Runs the reference and parses the last JSON line it prints.
Side run_reference(const std::string& cmd) {
  std::printf("reference: %s\n", cmd.c_str());
  std::fflush(stdout);
  FILE* p = popen(cmd.c_str(), "r");
  BT_CHECK(p != nullptr, "cannot start the reference: ", cmd);
  std::string out, last_json;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) {
    out += buf;
    if (buf[0] == '{') last_json = buf;
  }
  const int st = pclose(p);
  BT_CHECK(st == 0 && !last_json.empty(), "the PyTorch reference failed (exit status ", st,
           "); its output:\n", out,
           "\nrun it alone to see why, or pass --no-reference to measure BluTrain only");
  const auto j = nlohmann::json::parse(last_json);
  Side s;
  s.tokens_per_s = j.at("tokens_per_s").get<double>();
  s.step_ms = j.value("step_ms", 0.0);
  s.peak_mem = j.value("peak_mem_bytes", uint64_t{0});
  s.note = j.value("torch_version", std::string());
  return s;
}

Side run_blutrain(train::TrainConfig c, int64_t warmup, int64_t steps) {
  c.train.steps = warmup + steps;
  train::Trainer tr(c);
  for (int64_t i = 0; i < warmup; ++i) tr.step();
  profile_reset();
  double seconds = 0;
  int64_t tokens = 0;
  for (int64_t i = 0; i < steps; ++i) {
    const train::StepStats s = tr.step();
    seconds += s.seconds;
    tokens += s.tokens;
  }
  Side out;
  out.tokens_per_s = static_cast<double>(tokens) / seconds;
  out.step_ms = 1e3 * seconds / static_cast<double>(steps);
  out.peak_mem = train::peak_memory_bytes(tr.device());
  if (profiling_enabled())
    std::printf("BT_PROFILE (synchronizing; shares of the timed steps, %s):\n%s\n", c.train.precision.c_str(),
                profile_report().c_str());
  return out;
}

std::string write_random_shard(const std::string& dir, int64_t tokens, int64_t vocab) {
  std::mt19937_64 rng(1234);
  std::vector<uint16_t> t(static_cast<size_t>(tokens));
  for (auto& x : t) x = static_cast<uint16_t>(rng() % static_cast<uint64_t>(vocab));
  const std::string path = dir + "/bench_000000.bin";
  write_shard(path, t);
  return path;
}

}  // namespace

int run_bench(int argc, char** argv) {
  cli::Options opts(
      "blutrain bench",
      "Training throughput and peak memory of BluTrain vs the PyTorch reference, side by side.");
  opts.add_options()("preset", "model preset", cli::value<std::string>()->default_value("gpt2-124m"))(
      "precision", "comma-separated: fp32, tf32, bf16",
      cli::value<std::string>()->default_value("bf16,fp32"))("micro-batch", "sequences per step",
                                                             cli::value<int64_t>()->default_value("16"))(
      "seq", "sequence length (<= the preset's)", cli::value<int64_t>()->default_value("1024"))(
      "steps", "timed steps", cli::value<int64_t>()->default_value("20"))(
      "warmup", "untimed steps first", cli::value<int64_t>()->default_value("5"))(
      "device", "cuda, cuda:N or cpu", cli::value<std::string>()->default_value("auto"))(
      "reference", "the PyTorch reference script",
      cli::value<std::string>()->default_value("bench/gpt2_ref.py"))(
      "python", "Python interpreter with torch", cli::value<std::string>()->default_value("python3"))(
      "reference-args", "extra arguments for the reference (e.g. --compile)",
      cli::value<std::string>()->default_value(""))("no-reference", "measure BluTrain only")(
      "json", "also write the results to this JSON file", cli::value<std::string>())("h,help",
                                                                                     "show this help");
  cli::ParseResult r;
  try {
    r = opts.parse(argc, argv);
  } catch (const std::exception& e) {
    BT_FAIL(e.what(), " (see blutrain bench --help)");
  }
  if (r.count("help")) {
    std::printf("%s\n", opts.help().c_str());
    return 0;
  }
  const std::string preset = r["preset"].as<std::string>();
  const int64_t B = r["micro-batch"].as<int64_t>(), T = r["seq"].as<int64_t>();
  const int64_t steps = r["steps"].as<int64_t>(), warmup = r["warmup"].as<int64_t>();
  BT_CHECK(B > 0 && T > 0 && steps > 0 && warmup >= 0,
           "blutrain bench: --micro-batch, --seq and --steps must be > 0 and --warmup >= 0");
  const bool with_ref = r.count("no-reference") == 0;
  const std::string ref = r["reference"].as<std::string>();
  BT_CHECK(!with_ref || std::filesystem::exists(ref), "blutrain bench: the reference script '", ref,
           "' does not exist; run from the repository root, pass --reference PATH, or --no-reference");

  train::TrainConfig c;
  c.preset = preset;
  c.model = nn::gpt_preset(preset);
  BT_CHECK(T <= c.model.seq_len, "blutrain bench: --seq ", T, " exceeds the preset's context ",
           c.model.seq_len);
  c.model.seq_len = T;
  const std::string dir = std::filesystem::temp_directory_path() / ("bt_bench_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  struct Cleanup {
    std::string d;
    ~Cleanup() { std::filesystem::remove_all(d); }
  } cleanup{dir};
  const std::string shard = write_random_shard(dir, (warmup + steps + 1) * B * (T + 1), c.model.vocab_size);
  c.data.train = shard;
  c.data.val = "";
  c.data.shuffle = false;
  c.train.batch_size = c.train.micro_batch = B;
  c.train.device = r["device"].as<std::string>();
  c.train.sample_tokens = 0;
  const Device dev = train::resolve_device(c.train.device);

  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  std::vector<std::string> rows;
  std::stringstream precs(r["precision"].as<std::string>());
  for (std::string p; std::getline(precs, p, ',');) {
    parse_precision(p);
    c.train.precision = p;
    Side theirs;
    if (with_ref)
      theirs = run_reference(fmt::format(
          "{} {} bench --preset {} --precision {} --micro-batch {} --seq {} --steps {} --warmup {} --data {} "
          "--device {} --json {}",
          shell_quote(r["python"].as<std::string>()), shell_quote(ref), preset, p, B, T, steps, warmup,
          shell_quote(shard), dev.is_cuda() ? "cuda" : "cpu", r["reference-args"].as<std::string>()));
    std::printf("blutrain: %s %s, micro-batch %lld x %lld, %lld timed steps after %lld warmup...\n",
                preset.c_str(), p.c_str(), static_cast<long long>(B), static_cast<long long>(T),
                static_cast<long long>(steps), static_cast<long long>(warmup));
    std::fflush(stdout);
    const Side ours = run_blutrain(c, warmup, steps);
    if (dev.is_cuda()) cuda_empty_cache(dev.index);
    const auto mfu = peak_flops(dev, parse_precision(p));
    const double fpt = c.model.flops_per_token(T);
    nlohmann::ordered_json j;
    j["precision"] = p;
    j["blutrain_tokens_per_s"] = ours.tokens_per_s;
    j["blutrain_step_ms"] = ours.step_ms;
    j["blutrain_peak_mem_bytes"] = ours.peak_mem;
    if (mfu) j["blutrain_mfu"] = ours.tokens_per_s * fpt / *mfu;
    if (with_ref) {
      j["pytorch_tokens_per_s"] = theirs.tokens_per_s;
      j["pytorch_peak_mem_bytes"] = theirs.peak_mem;
      j["throughput_ratio"] = ours.tokens_per_s / theirs.tokens_per_s;
      j["memory_ratio"] = theirs.peak_mem ? static_cast<double>(ours.peak_mem) / theirs.peak_mem : 0.0;
      j["torch_version"] = theirs.note;
    }
    results.push_back(j);
    rows.push_back(
        fmt::format("| {} | {:.1f}K | {} | {} | {} | {} | {} |", p, ours.tokens_per_s / 1e3,
                    with_ref ? fmt::format("{:.1f}K", theirs.tokens_per_s / 1e3) : "-",
                    with_ref ? fmt::format("**{:.3f}x**", ours.tokens_per_s / theirs.tokens_per_s) : "-",
                    human_bytes(ours.peak_mem), with_ref ? human_bytes(theirs.peak_mem) : "-",
                    with_ref && theirs.peak_mem
                        ? fmt::format("**{:.3f}x**", static_cast<double>(ours.peak_mem) / theirs.peak_mem)
                        : "-"));
  }
  std::printf("\n%s, T=%lld, micro-batch %lld, AdamW + clip 1.0, %lld timed steps, device %s\n\n",
              preset.c_str(), static_cast<long long>(T), static_cast<long long>(B),
              static_cast<long long>(steps), dev.str().c_str());
  std::printf(
      "| precision | BluTrain tok/s | PyTorch eager tok/s | throughput ratio | BluTrain peak mem | "
      "PyTorch peak mem | memory ratio |\n|---|---|---|---|---|---|---|\n");
  for (const std::string& row : rows) std::printf("%s\n", row.c_str());
  if (r.count("json")) {
    std::ofstream f(r["json"].as<std::string>());
    BT_CHECK(f << results.dump(2) << "\n", "cannot write '", r["json"].as<std::string>(), "'");
  }
  return 0;
}

}  // namespace bt::launcher
