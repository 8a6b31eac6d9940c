// `blutrain bench`: training throughput and peak memory of BluTrain and of the
// PyTorch reference (bench/gpt2_ref.py) -- eager, under torch.compile, or both
// (--reference) -- measured in the same run on the same token stream and
// model, with BluTrain's ratio against each. Each reference runs first, in its
// own process, so each side has the GPU to itself. BluTrain's fp32x3 is
// measured against PyTorch in strict fp32: the numerics it keeps (PyTorch has
// no error-compensated TF32), and the row says so.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "compiler/kernel_cache.h"
#include "compiler/mlir_backend.h"
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "launcher/progress.h"
#include "runtime/bt.h"
#include "runtime/core/profiler.h"
#include "runtime/data/shard.h"
#include "runtime/nn/registry.h"
#include "runtime/train/trainer.h"

namespace bt::launcher {
namespace {

struct Side {
  double tokens_per_s = 0;
  double step_ms = 0;         // the mean: what the tokens/s come from
  double step_ms_median = 0;  // the median and the fastest step, to tell
  double step_ms_min = 0;     // a few slow steps from a slow steady state
  uint64_t peak_mem = 0;
  std::string note;
  std::vector<double> runs;  // tokens/s of each run (--repeats), in order
};

/// One side over its repeated runs: the median tokens/s and step time, the
/// largest peak memory, every run's tokens/s kept.
Side combine(const std::vector<Side>& runs) {
  BT_ASSERT(!runs.empty());
  auto median = [&](auto field) {
    std::vector<double> v;
    for (const Side& r : runs) v.push_back(field(r));
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  };
  Side s;
  s.tokens_per_s = median([](const Side& r) { return r.tokens_per_s; });
  s.step_ms = median([](const Side& r) { return r.step_ms; });
  s.step_ms_median = median([](const Side& r) { return r.step_ms_median; });
  s.step_ms_min = median([](const Side& r) { return r.step_ms_min; });
  for (const Side& r : runs) {
    s.peak_mem = std::max(s.peak_mem, r.peak_mem);
    s.runs.push_back(r.tokens_per_s);
  }
  s.note = runs[0].note;
  return s;
}

/// "412.0K", or with several runs "412.0K (364.0-436.0K)": the median and the range.
std::string tokens_cell(const Side& s) {
  std::string c = fmt::format("{:.1f}K", s.tokens_per_s / 1e3);
  if (s.runs.size() > 1)
    c += fmt::format(" ({:.1f}-{:.1f}K)", *std::min_element(s.runs.begin(), s.runs.end()) / 1e3,
                     *std::max_element(s.runs.begin(), s.runs.end()) / 1e3);
  return c;
}

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
           "\nrun it alone to see why, or pass --reference none to measure BluTrain only");
  const auto j = nlohmann::json::parse(last_json);
  Side s;
  s.tokens_per_s = j.at("tokens_per_s").get<double>();
  s.step_ms = j.value("step_ms", 0.0);
  s.step_ms_median = j.value("step_ms_median", 0.0);
  s.step_ms_min = j.value("step_ms_min", 0.0);
  std::printf("reference: mean step %.2f ms, median %.2f ms, fastest %.2f ms\n", s.step_ms, s.step_ms_median,
              s.step_ms_min);
  s.peak_mem = j.value("peak_mem_bytes", uint64_t{0});
  s.note = j.value("torch_version", std::string());
  return s;
}

Side run_blutrain(train::TrainConfig c, int64_t warmup, int64_t steps) {
  c.train.steps = warmup + steps;
  if (c.train.compile != "false")
    compiler::install_fusion_backend({c.compile.dump, compiler::kernel_cache_dir(c.compile.cache_dir)});
  train::Trainer tr(c);
  for (int64_t i = 0; i < warmup; ++i) {
    tr.step();
    if (const std::string n = tr.take_notice(); !n.empty()) std::printf("blutrain: %s\n", n.c_str());
  }
  profile_reset();
  double seconds = 0;
  int64_t tokens = 0;
  std::vector<double> step_ms;
  for (int64_t i = 0; i < steps; ++i) {
    const train::StepStats s = tr.step();
    seconds += s.seconds;
    tokens += s.tokens;
    step_ms.push_back(1e3 * s.seconds);
  }
  Side out;
  out.tokens_per_s = static_cast<double>(tokens) / seconds;
  out.step_ms = 1e3 * seconds / static_cast<double>(steps);
  if (!step_ms.empty()) {
    std::sort(step_ms.begin(), step_ms.end());
    const size_t n = step_ms.size();
    out.step_ms_median = n % 2 ? step_ms[n / 2] : 0.5 * (step_ms[n / 2 - 1] + step_ms[n / 2]);
    out.step_ms_min = step_ms.front();
  }
  std::printf("blutrain: mean step %.2f ms, median %.2f ms, fastest %.2f ms\n", out.step_ms,
              out.step_ms_median, out.step_ms_min);
  out.peak_mem = train::peak_memory_bytes(tr.device());
  if (profiling_enabled())
    std::printf("BT_PROFILE (synchronizing; shares of the timed steps, %s):\n%s\n", c.train.precision.c_str(),
                profile_report().c_str());
  return out;
}

/// The precision the PyTorch reference runs for a BluTrain precision.
std::string reference_precision(const std::string& p) { return p == "fp32x3" ? "fp32" : p; }

/// What each --reference mode runs, as the table names it.
const std::map<std::string, std::string> kReferenceNames = {{"eager", "PyTorch eager"},
                                                            {"compile", "torch.compile"}};

/// The reference runs --reference asks for, in order.
std::vector<std::string> reference_modes(const std::string& v) {
  if (v == "both") return {"eager", "compile"};
  if (v == "none") return {};
  BT_CHECK(kReferenceNames.count(v), "blutrain bench: --reference '", v,
           "' is not one of eager, compile, both, none",
           v.find('/') != std::string::npos || v.ends_with(".py")
               ? " (the reference script's path is --reference-script now)"
               : "");
  return {v};
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
  opts.add_options()("preset", "model preset (tiny, gpt2-124m, llama-tiny, llama-150m)",
                     cli::value<std::string>()->default_value("gpt2-124m"))(
      "precision", "comma-separated: fp32, tf32, fp32x3, bf16 (the references run fp32x3 as strict fp32)",
      cli::value<std::string>()->default_value("bf16,fp32"))("micro-batch", "sequences per step",
                                                             cli::value<int64_t>()->default_value("16"))(
      "seq", "sequence length (<= the preset's)", cli::value<int64_t>()->default_value("1024"))(
      "steps", "timed steps", cli::value<int64_t>()->default_value("20"))(
      "warmup", "untimed steps first", cli::value<int64_t>()->default_value("5"))(
      "recompute",
      "comma-separated train.recompute modes to measure BluTrain in: auto (selective under bf16, else none), "
      "none, selective, full",
      cli::value<std::string>()->default_value("auto"))(
      "cuda-graph", "train.cuda_graph settings to measure BluTrain with: on, off or both",
      cli::value<std::string>()->default_value("on"))(
      "variants",
      "comma-separated BluTrain models to measure: fused (the hand-fused ops), primitive (model.fused_ops "
      "false), each optionally +compile (train.compile true), e.g. fused,primitive,primitive+compile; "
      "a llama model is primitive either way; auto: fused for gpt2, primitive+compile for llama",
      cli::value<std::string>()->default_value("auto"))("device", "cuda, cuda:N or cpu",
                                                        cli::value<std::string>()->default_value("auto"))(
      "repeats",
      "runs of each side, BluTrain's and every reference's, interleaved (each repeat runs every "
      "reference, then every BluTrain configuration); the table reports the median tokens/s (and the "
      "range) and the largest peak memory",
      cli::value<int64_t>()->default_value("1"))(
      "reference", "PyTorch references to measure: eager, compile (torch.compile), both or none",
      cli::value<std::string>()->default_value("both"))(
      "reference-script", "the PyTorch reference script",
      cli::value<std::string>()->default_value("bench/gpt2_ref.py"))(
      "python", "Python interpreter with torch", cli::value<std::string>()->default_value("python3"))(
      "reference-args", "extra arguments for every reference run",
      cli::value<std::string>()->default_value(""))("no-reference",
                                                    "measure BluTrain only (--reference none)")(
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
  const int64_t repeats = r["repeats"].as<int64_t>();
  BT_CHECK(B > 0 && T > 0 && steps > 0 && warmup >= 0 && repeats > 0,
           "blutrain bench: --micro-batch, --seq, --steps and --repeats must be > 0 and --warmup >= 0");
  const std::vector<std::string> modes = r.count("no-reference")
                                             ? std::vector<std::string>{}
                                             : reference_modes(r["reference"].as<std::string>());
  const std::string ref = r["reference-script"].as<std::string>();
  BT_CHECK(
      modes.empty() || std::filesystem::exists(ref), "blutrain bench: the reference script '", ref,
      "' does not exist; run from the repository root, pass --reference-script PATH, or --reference none");

  train::TrainConfig c;
  c.preset = preset;
  c.model = nn::model_preset(preset);
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
  std::vector<std::string> recompute_modes;
  std::stringstream rcs(r["recompute"].as<std::string>());
  for (std::string m; std::getline(rcs, m, ',');) {
    try {
      if (m != "auto") parse_recompute(m);
    } catch (const Error& e) {
      BT_FAIL("blutrain bench --recompute: ", e.what(), " (or auto)");
    }
    recompute_modes.push_back(m);
  }
  BT_CHECK(!recompute_modes.empty(), "blutrain bench --recompute: name at least one mode");
  const std::string graph_opt = r["cuda-graph"].as<std::string>();
  BT_CHECK(graph_opt == "on" || graph_opt == "off" || graph_opt == "both",
           "blutrain bench --cuda-graph: use on, off or both, got '", graph_opt, "'");
  std::vector<bool> graph_modes;
  if (graph_opt != "off") graph_modes.push_back(true);
  if (graph_opt != "on") graph_modes.push_back(false);
  std::vector<std::string> variants;
  std::string vlist = r["variants"].as<std::string>();
  if (vlist == "auto") vlist = c.model.arch == "llama" ? "primitive+compile" : "fused";
  std::stringstream vs(vlist);
  for (std::string v; std::getline(vs, v, ',');) {
    BT_CHECK(v == "fused" || v == "primitive" || v == "fused+compile" || v == "primitive+compile",
             "blutrain bench --variants: '", v,
             "' is not one of fused, primitive, fused+compile, primitive+compile");
    variants.push_back(v);
  }
  BT_CHECK(!variants.empty(), "blutrain bench --variants: name at least one model");
  std::stringstream precs(r["precision"].as<std::string>());
  for (std::string p; std::getline(precs, p, ',');) {
    parse_precision(p);
    c.train.precision = p;
    const std::string ref_p = reference_precision(p);
    const size_t per_variant = recompute_modes.size() * graph_modes.size();
    const size_t configs = variants.size() * per_variant;
    // BluTrain configuration `run` of this precision, set into c.
    auto configure = [&](size_t run) {
      const std::string& variant = variants[run / per_variant];
      c.model.fused_ops = variant.rfind("fused", 0) == 0;
      c.train.compile = variant.find("+compile") != std::string::npos ? "true" : "false";
      c.train.recompute = recompute_modes[run % per_variant / graph_modes.size()];
      c.train.cuda_graph = graph_modes[run % graph_modes.size()];
      return variant;
    };
    // Each repeat runs every reference, then every BluTrain configuration, so
    // the two sides alternate and each run follows another's. Run back to
    // back, BluTrain's repeats slowed from run to run (bf16 on an H200: 30.3
    // to 31.5 ms a step, the card at 600-690 W of its 700 W cap), where
    // separate processes a few seconds apart did not (bench/RESULTS.md issue
    // 18 step 22).
    std::vector<std::vector<Side>> ref_runs(modes.size()), our_runs(configs);
    for (int64_t rep = 0; rep < repeats; ++rep) {
      for (size_t i = 0; i < modes.size(); ++i)
        ref_runs[i].push_back(run_reference(
            fmt::format("{} {} bench --preset {} --precision {} --micro-batch {} --seq {} --steps {} "
                        "--warmup {} --data {} "
                        "--device {} --json{} {}",
                        shell_quote(r["python"].as<std::string>()), shell_quote(ref), preset, ref_p, B, T,
                        steps, warmup, shell_quote(shard), dev.is_cuda() ? "cuda" : "cpu",
                        modes[i] == "compile" ? " --compile" : "", r["reference-args"].as<std::string>())));
      for (size_t run = 0; run < configs; ++run) {
        const std::string variant = configure(run);
        const std::string mode(recompute_name(c.recompute()));
        std::printf(
            "blutrain: %s %s [%s], recompute %s, CUDA graph %s, micro-batch %lld x %lld, %lld timed "
            "steps after %lld warmup%s...\n",
            preset.c_str(), p.c_str(), variant.c_str(), mode.c_str(), c.train.cuda_graph ? "on" : "off",
            static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(steps),
            static_cast<long long>(warmup),
            repeats > 1 ? fmt::format(", run {} of {}", rep + 1, repeats).c_str() : "");
        std::fflush(stdout);
        our_runs[run].push_back(run_blutrain(c, warmup, steps));
        if (dev.is_cuda()) cuda_empty_cache(dev.index);
      }
    }
    std::vector<Side> theirs;
    for (const std::vector<Side>& runs : ref_runs) theirs.push_back(combine(runs));
    const auto mfu = peak_flops(dev, parse_precision(p));
    const double fpt = c.model.flops_per_token(T);
    for (size_t run = 0; run < configs; ++run) {
      const std::string variant = configure(run);
      const std::string mode(recompute_name(c.recompute()));
      const Side ours = combine(our_runs[run]);
      nlohmann::ordered_json j;
      j["precision"] = p;
      if (!modes.empty()) j["reference_precision"] = ref_p;
      j["recompute"] = mode;
      j["cuda_graph"] = c.train.cuda_graph;
      j["variant"] = variant;
      std::string label = mode == "none" ? p : p + " (" + mode + ")";
      if (graph_modes.size() > 1) label += c.train.cuda_graph ? " graph" : " eager";
      if (variants.size() > 1 || variant != "fused") label += " [" + variant + "]";
      j["blutrain_tokens_per_s"] = ours.tokens_per_s;
      j["blutrain_step_ms"] = ours.step_ms;
      j["blutrain_step_ms_median"] = ours.step_ms_median;
      j["blutrain_peak_mem_bytes"] = ours.peak_mem;
      if (repeats > 1) j["blutrain_tokens_per_s_runs"] = ours.runs;
      if (mfu) j["blutrain_mfu"] = ours.tokens_per_s * fpt / *mfu;
      // One row per reference (a row without one when there is none): BluTrain's
      // figures, the reference's, and BluTrain's ratio to it.
      for (size_t i = 0; i < std::max<size_t>(modes.size(), 1); ++i) {
        const Side* t = i < theirs.size() ? &theirs[i] : nullptr;
        const std::string name =
            t ? kReferenceNames.at(modes[i]) + (ref_p != p ? " (strict " + ref_p + ")" : "") : "-";
        const double speed = t ? ours.tokens_per_s / t->tokens_per_s : 0.0;
        const double mem = t && t->peak_mem ? static_cast<double>(ours.peak_mem) / t->peak_mem : 0.0;
        if (t) {
          const std::string k = modes[i];
          j[k + "_tokens_per_s"] = t->tokens_per_s;
          j[k + "_step_ms"] = t->step_ms;
          j[k + "_step_ms_median"] = t->step_ms_median;
          if (repeats > 1) j[k + "_tokens_per_s_runs"] = t->runs;
          j[k + "_peak_mem_bytes"] = t->peak_mem;
          j[k + "_throughput_ratio"] = speed;
          j[k + "_memory_ratio"] = mem;
          j["torch_version"] = t->note;
        }
        rows.push_back(fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} |", label, name,
                                   tokens_cell(ours), t ? tokens_cell(*t) : "-",
                                   t ? fmt::format("**{:.3f}x**", speed) : "-", human_bytes(ours.peak_mem),
                                   t ? human_bytes(t->peak_mem) : "-",
                                   t && t->peak_mem ? fmt::format("**{:.3f}x**", mem) : "-"));
      }
      results.push_back(j);
    }
  }
  std::printf("\n%s, T=%lld, micro-batch %lld, AdamW + clip 1.0, %lld timed steps, device %s\n\n",
              preset.c_str(), static_cast<long long>(T), static_cast<long long>(B),
              static_cast<long long>(steps), dev.str().c_str());
  std::printf(
      "| precision | reference | BluTrain tok/s | reference tok/s | throughput ratio | BluTrain peak mem | "
      "reference peak mem | memory ratio |\n|---|---|---|---|---|---|---|---|\n");
  for (const std::string& row : rows) std::printf("%s\n", row.c_str());
  if (r.count("json")) {
    std::ofstream f(r["json"].as<std::string>());
    BT_CHECK(f << results.dump(2) << "\n", "cannot write '", r["json"].as<std::string>(), "'");
  }
  return 0;
}

}  // namespace bt::launcher
