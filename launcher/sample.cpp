// `blutrain sample`: loads a weights file written by `blutrain train
// --save-weights` and prints a continuation of a prompt.
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "launcher/model_file.h"
#include "launcher/sample_text.h"
#include "runtime/bt.h"
#include "runtime/train/trainer.h"

namespace bt::launcher {

int run_sample(int argc, char** argv) {
  cli::Options opts("blutrain sample", "Sample text from a trained GPT weights file.");
  opts.add_options()("w,weights", "weights file (HDF5) from `blutrain train --save-weights`",
                     cli::value<std::string>())("p,prompt", "text to continue",
                                                cli::value<std::string>()->default_value("\n"))(
      "n,tokens", "tokens to sample", cli::value<int64_t>()->default_value("200"))(
      "temperature", "sampling temperature (> 0)", cli::value<double>()->default_value("0.8"))(
      "top-k", "sample among the k likeliest tokens (0: all)", cli::value<int64_t>()->default_value("40"))(
      "tokenizer", "folder with encoder.json and vocab.bpe",
      cli::value<std::string>()->default_value("data/tokenizer"))(
      "device", "auto, cpu, cuda or cuda:N", cli::value<std::string>()->default_value("auto"))(
      "seed", "random seed", cli::value<uint64_t>()->default_value("1337"))("h,help", "show this help");
  cli::ParseResult r;
  try {
    r = opts.parse(argc, argv);
  } catch (const std::exception& e) {
    BT_FAIL(e.what(), " (see blutrain sample --help)");
  }
  if (r.count("help")) {
    std::printf("%s\n", opts.help().c_str());
    return 0;
  }
  BT_CHECK(r.count("weights"),
           "blutrain sample: --weights FILE is required (write one with "
           "`blutrain train --save-weights FILE`)");
  const int64_t n = r["tokens"].as<int64_t>();
  const double temp = r["temperature"].as<double>();
  const int64_t top_k = r["top-k"].as<int64_t>();
  BT_CHECK(n > 0, "blutrain sample: --tokens must be > 0, got ", n);
  BT_CHECK(temp > 0, "blutrain sample: --temperature must be > 0, got ", temp);
  BT_CHECK(top_k >= 0, "blutrain sample: --top-k must be >= 0, got ", top_k);
  const Device d = train::resolve_device(r["device"].as<std::string>());
  const auto model = load_model(r["weights"].as<std::string>(), d);
  const SamplePrompt p = prepare_sample(r["tokenizer"].as<std::string>(), r["prompt"].as<std::string>(),
                                        model->config().vocab_size);
  print_sample(*model, p, n, temp, top_k, r["seed"].as<uint64_t>());
  return 0;
}

}  // namespace bt::launcher
