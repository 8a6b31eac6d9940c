// `blutrain bench` against a stand-in reference script (the real one needs
// torch and a GPU: scripts/gpu-fidelity runs it): each --reference mode runs
// the script as it should (--compile for torch.compile), every reference gets
// its own row and BluTrain's ratios against it, fp32x3 is measured against
// the references' strict fp32, and bad input is named.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/paths.h"
#include "tests/support/run_command.h"
#include "tests/support/temp_dir.h"

namespace bt {
namespace {

class Bench : public ::testing::Test {
 protected:
  void SetUp() override {
    // Prints a line of chatter, then, with --json, its JSON result, as
    // gpt2_ref.py does: eager 1000 tokens/s and 2 MiB, torch.compile 4000
    // tokens/s and 1 MiB.
    // Every call appends its arguments to ref.py.calls.
    std::ofstream(script_) << "import json, sys\n"
                              "open(sys.argv[0] + '.calls', 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
                              "if '--fail' in sys.argv: sys.exit('reference: no torch here')\n"
                              "c = '--compile' in sys.argv\n"
                              "print('gpt2_ref bench: warming up')\n"
                              "if '--json' in sys.argv: print(json.dumps({'tokens_per_s': 4000.0 if c else "
                              "1000.0, 'step_ms': 1.0,\n"
                              "                  'step_ms_median': 0.75 if c else 0.5, 'step_ms_min': 0.25,\n"
                              "                  'peak_mem_bytes': 2**20 if c else 2**21,\n"
                              "                  'torch_version': 'stand-in'}))\n";
  }
  /// `blutrain bench` of the tiny preset, one short step on the CPU, plus `args`.
  test::CommandResult bench(const std::string& args, const std::string& precision = "fp32") const {
    return test::run_command(test::blutrain_exe() + " bench --preset tiny --device cpu --precision " +
                             precision +
                             " --micro-batch 1 --seq 16"
                             " --steps 1 --warmup 0 --python python3 --reference-script " +
                             script_ + " --json " + dir_.file("out.json") + " " + args);
  }
  /// The argument lines the script was called with, in order.
  std::vector<std::string> calls() const {
    std::vector<std::string> v;
    std::ifstream f(script_ + ".calls");
    for (std::string l; std::getline(f, l);) v.push_back(l);
    return v;
  }
  nlohmann::json result() const { return nlohmann::json::parse(std::ifstream(dir_.file("out.json"))).at(0); }

  test::TempDir dir_{"bt_bench"};
  std::string script_ = dir_.file("ref.py");
};

TEST_F(Bench, BothReferencesRunAndEachGetsItsRatios) {
  const test::CommandResult r = bench("");  // --reference both is the default
  ASSERT_EQ(r.status, 0) << r.out;
  const std::vector<std::string> c = calls();
  ASSERT_EQ(c.size(), 2u) << r.out;
  EXPECT_EQ(c[0].find("--compile"), std::string::npos) << c[0];
  EXPECT_NE(c[1].find("--compile"), std::string::npos) << c[1];
  for (const std::string& l : c)
    EXPECT_NE(l.find("--precision fp32 --micro-batch 1 --seq 16"), std::string::npos) << l;

  const nlohmann::json j = result();
  const double ours = j.at("blutrain_tokens_per_s").get<double>();
  ASSERT_GT(ours, 0.0);
  EXPECT_DOUBLE_EQ(j.at("eager_tokens_per_s").get<double>(), 1000.0);
  EXPECT_DOUBLE_EQ(j.at("compile_tokens_per_s").get<double>(), 4000.0);
  EXPECT_NEAR(j.at("eager_throughput_ratio").get<double>(), ours / 1000.0, 1e-12 * ours);
  EXPECT_NEAR(j.at("compile_throughput_ratio").get<double>(), ours / 4000.0, 1e-12 * ours);
  const double mem = static_cast<double>(j.at("blutrain_peak_mem_bytes").get<uint64_t>());
  EXPECT_DOUBLE_EQ(j.at("eager_memory_ratio").get<double>(), mem / (1 << 21));
  EXPECT_DOUBLE_EQ(j.at("compile_memory_ratio").get<double>(), mem / (1 << 20));
  EXPECT_NE(r.out.find("| fp32 | PyTorch eager | "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| fp32 | torch.compile | "), std::string::npos) << r.out;
  // Each side's mean and median step, to tell a few slow steps from a slow steady state.
  EXPECT_DOUBLE_EQ(j.at("eager_step_ms_median").get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j.at("compile_step_ms_median").get<double>(), 0.75);
  EXPECT_GT(j.at("blutrain_step_ms_median").get<double>(), 0.0);
  EXPECT_NE(r.out.find("reference: mean step 1.00 ms, median 0.75 ms, fastest 0.25 ms"), std::string::npos)
      << r.out;
}

// --repeats N runs each side N times, interleaved (eager, compile, BluTrain,
// eager, ...), and reports the median tokens/s with the range and every run
// in the JSON. The stand-in here answers 1000, 3000, 2000 tokens/s at its
// first, second and third eager call.
TEST_F(Bench, RepeatsReportTheMedianAndEveryRun) {
  std::ofstream(script_)
      << "import json, sys\n"
         "calls = sys.argv[0] + '.calls'\n"
         "open(calls, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
         "n = sum(1 for l in open(calls) if '--compile' not in l)\n"
         "c = '--compile' in sys.argv\n"
         "tps = 4000.0 if c else [1000.0, 3000.0, 2000.0][n - 1]\n"
         "print(json.dumps({'tokens_per_s': tps, 'step_ms': 1.0, 'peak_mem_bytes': 2**20 * n}))\n";
  const test::CommandResult r = bench("--repeats 3");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::vector<std::string> c = calls();
  ASSERT_EQ(c.size(), 6u) << r.out;
  for (size_t i = 0; i < c.size(); ++i)
    EXPECT_EQ(c[i].find("--compile") != std::string::npos, i % 2 == 1) << i << ": " << c[i];
  // The order of the runs in the log: R a reference's command line, B one of BluTrain's runs.
  std::string order;
  for (size_t at = 0; at < r.out.size();) {
    const size_t end = std::min(r.out.find('\n', at), r.out.size());
    const std::string line = r.out.substr(at, end - at);
    if (line.rfind("reference: '", 0) == 0) order += 'R';
    if (line.rfind("blutrain: tiny fp32", 0) == 0) order += 'B';
    at = end + 1;
  }
  EXPECT_EQ(order, "RRBRRBRRB") << r.out;
  EXPECT_NE(r.out.find(", run 3 of 3..."), std::string::npos) << r.out;
  const nlohmann::json j = result();
  EXPECT_DOUBLE_EQ(j.at("eager_tokens_per_s").get<double>(), 2000.0);  // the median
  EXPECT_EQ(j.at("eager_tokens_per_s_runs").get<std::vector<double>>(),
            (std::vector<double>{1000, 3000, 2000}));
  EXPECT_EQ(j.at("eager_peak_mem_bytes").get<uint64_t>(), uint64_t{3} << 20);  // the largest
  EXPECT_EQ(j.at("blutrain_tokens_per_s_runs").size(), 3u);
  EXPECT_NE(r.out.find("| PyTorch eager | "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| 2.0K (1.0-3.0K) |"), std::string::npos) << r.out;
  EXPECT_NE(bench("--repeats 0").status, 0);
}

TEST_F(Bench, OneReferenceOrNone) {
  test::CommandResult r = bench("--reference compile");
  ASSERT_EQ(r.status, 0) << r.out;
  ASSERT_EQ(calls().size(), 1u);
  EXPECT_NE(calls()[0].find("--compile"), std::string::npos);
  EXPECT_FALSE(result().contains("eager_tokens_per_s")) << result();
  EXPECT_EQ(r.out.find("| fp32 | PyTorch eager | "), std::string::npos) << r.out;

  r = bench("--reference eager");
  ASSERT_EQ(r.status, 0) << r.out;
  ASSERT_EQ(calls().size(), 2u);
  EXPECT_EQ(calls()[1].find("--compile"), std::string::npos);
  EXPECT_FALSE(result().contains("compile_tokens_per_s")) << result();

  for (const char* none : {"--reference none", "--no-reference"}) {
    r = bench(none);
    ASSERT_EQ(r.status, 0) << none << "\n" << r.out;
    EXPECT_EQ(calls().size(), 2u) << none << ": no reference runs";
    EXPECT_NE(r.out.find("| fp32 | - | "), std::string::npos) << r.out;
  }
}

// PyTorch has no 3xTF32: BluTrain's fp32x3 is measured against the
// references in strict fp32, the numerics fp32x3 keeps, and the rows say so.
TEST_F(Bench, Fp32x3IsMeasuredAgainstStrictFp32) {
  const test::CommandResult r = bench("", "fp32x3,fp32");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::vector<std::string> c = calls();
  ASSERT_EQ(c.size(), 4u) << r.out;
  for (const std::string& l : c)
    EXPECT_NE(l.find("--precision fp32 --micro-batch 1 --seq 16"), std::string::npos) << l;
  EXPECT_NE(r.out.find("| fp32x3 | PyTorch eager (strict fp32) | "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| fp32x3 | torch.compile (strict fp32) | "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| fp32 | PyTorch eager | "), std::string::npos) << r.out;
  const nlohmann::json all = nlohmann::json::parse(std::ifstream(dir_.file("out.json")));
  ASSERT_EQ(all.size(), 2u) << all;
  EXPECT_EQ(all[0].at("precision"), "fp32x3");
  EXPECT_EQ(all[0].at("reference_precision"), "fp32");
  EXPECT_EQ(all[1].at("reference_precision"), "fp32");
  EXPECT_GT(all[0].at("blutrain_tokens_per_s").get<double>(), 0.0);
}

TEST_F(Bench, BadReferencesAreNamed) {
  test::CommandResult r = bench("--reference jit");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--reference 'jit' is not one of eager, compile, both, none"), std::string::npos)
      << r.out;

  r = bench("--reference bench/gpt2_ref.py");  // the option's meaning before --reference-script
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("the reference script's path is --reference-script now"), std::string::npos) << r.out;

  r = test::run_command(test::blutrain_exe() + " bench --device cpu --reference-script " +
                        dir_.file("none.py"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("none.py' does not exist"), std::string::npos) << r.out;

  r = bench("--reference eager --reference-args=--fail");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("no torch here"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--reference none"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace bt
