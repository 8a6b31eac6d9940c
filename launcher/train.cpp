// `blutrain train`: trains a model (model.arch) from a YAML config (or the embedded `tiny`
// default) with live progress, periodic validation, a metrics JSONL file, a
// final sample and a summary. Under mpirun (or `blutrain launch`) every rank
// runs this; rank 0 prints and writes the files, the others print only errors
// and a closing line on stderr.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "compiler/kernel_cache.h"
#include "compiler/mlir_backend.h"
#include "launcher/checkpointing.h"
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "launcher/config.h"
#include "launcher/heartbeat.h"
#include "launcher/model_file.h"
#include "launcher/preflight.h"
#include "launcher/progress.h"
#include "launcher/rank_log.h"
#include "launcher/sample_text.h"
#include "launcher/stop_request.h"
#include "launcher/text_file.h"
#include "runtime/bt.h"
#include "runtime/dist/world.h"
#include "runtime/train/trainer.h"

namespace bt::launcher {
namespace {

struct Options {
  std::string config, save_init, init_weights, resolved;
  std::vector<std::string> sets;
};

Options parse(int argc, char** argv) {
  cli::Options opts("blutrain train",
                    "Train a model (model.arch: gpt2, llama) on token shards. Without --config: the embedded "
                    "default (the `tiny` preset on the jargon corpus, made by `scripts/quickstart`).");
  opts.add_options()("c,config", "YAML config file (see configs/)", cli::value<std::string>())(
      "s,set", "override a key: section.key=value (repeatable)", cli::value<std::vector<std::string>>())(
      "metrics", "write one JSON object per step to this file (same as train.metrics)",
      cli::value<std::string>())("init-weights", "start from this weights file instead of the seeded init",
                                 cli::value<std::string>())(
      "save-init", "write the initial weights to this file before step 1", cli::value<std::string>())(
      "save-weights", "write the final weights to this file (same as train.save_weights)",
      cli::value<std::string>())("resolved-config", "write the resolved config as JSON to this file",
                                 cli::value<std::string>())("h,help", "show this help and every config key");
  cli::ParseResult r;
  try {
    r = opts.parse(argc, argv);
  } catch (const std::exception& e) {
    BT_FAIL(e.what(), " (see blutrain train --help)");
  }
  if (r.count("help")) {
    std::printf("%s\nconfig keys (YAML sections model:, data:, train:; or --set section.key=value):\n%s",
                opts.help().c_str(), config_keys_help().c_str());
    std::exit(0);
  }
  BT_CHECK(r.unmatched().empty(), "blutrain train: unexpected argument '",
           r.unmatched().empty() ? "" : r.unmatched()[0], "' (see blutrain train --help)");
  Options o;
  auto str = [&](const char* k, std::string& dst) {
    if (r.count(k)) dst = r[k].as<std::string>();
  };
  str("config", o.config);
  str("init-weights", o.init_weights);
  str("save-init", o.save_init);
  str("resolved-config", o.resolved);
  if (r.count("set")) o.sets = r["set"].as<std::vector<std::string>>();
  if (r.count("metrics")) o.sets.push_back("train.metrics=" + r["metrics"].as<std::string>());
  if (r.count("save-weights")) o.sets.push_back("train.save_weights=" + r["save-weights"].as<std::string>());
  return o;
}

}  // namespace

int run_train(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const train::TrainConfig cfg0 = load_train_config(o.config, o.sets);
  const dist::World& w = dist::init_world(cfg0.dist.insecure);
  const bool lead = w.rank == 0;
  // Under `blutrain launch` each rank logs to its own file (rank 0 to the
  // terminal too); under a bare mpirun only rank 0 prints.
  const bool logged = open_rank_log(w);
  if (!lead && !logged && !std::freopen("/dev/null", "w", stdout))
    BT_FAIL("rank ", w.rank, ": cannot silence stdout");
  train::TrainConfig cfg = cfg0;
  if (!lead) cfg.train.save_weights.clear();  // rank 0 writes the files
  if (lead && !o.resolved.empty())
    write_text_file(o.resolved, config_to_json(cfg0, w.size) + "\n", "the resolved config");

  // Note [Fail fast]: every input the run needs later, checked now.
  check_run_inputs(cfg);
  std::optional<SamplePrompt> sample;
  if (lead) {
    check_writable_target(cfg.train.save_weights, "train.save_weights (--save-weights)");
    check_writable_target(o.save_init, "--save-init");
    if (cfg.train.sample_tokens > 0) {
      try {
        sample = prepare_sample(cfg.data.tokenizer, cfg.train.sample_prompt, cfg.model.vocab_size);
      } catch (const Error& e) {
        BT_FAIL("the sample after training (train.sample_tokens=", cfg.train.sample_tokens,
                ", with data.tokenizer '", cfg.data.tokenizer,
                "' and train.sample_prompt) cannot be made: ", e.what(),
                "; or set train.sample_tokens=0 to train without a sample");
      }
    }
  }

  // train.compile: the compiler's backend, before the Trainer asks for it (docs/compiler.md).
  if (cfg.train.compile != "false")
    compiler::install_fusion_backend({cfg.compile.dump, compiler::kernel_cache_dir(cfg.compile.cache_dir)});
  // Initial weights go in before the strategy takes the parameters over.
  auto trainer = std::make_unique<train::Trainer>(cfg, [&](nn::Model& m) {
    if (!o.init_weights.empty()) load_model_into(o.init_weights, m);
    if (lead && !o.save_init.empty()) save_model(o.save_init, m);
  });
  train::Trainer& tr = *trainer;
  nn::Model& model = tr.model();
  cfg = tr.config();  // the micro-batch this rank count runs (Note [Batch split])

  const nn::ModelConfig& mc = cfg.model;
  const train::TrainOptions& t = cfg.train;
  const TokenLoader& data = tr.train_loader();
  int64_t data_tokens = 0;
  for (const ShardInfo& s : data.shards()) data_tokens += s.num_tokens;
  const std::map<std::string, int64_t> shape = model.shape_attrs();
  const std::string heads = mc.kv_heads() == mc.n_head ? cat(mc.n_head, " heads")
                                                       : cat(mc.n_head, " heads (", mc.kv_heads(), " K/V)");
  const std::string ffn = shape.count("ffn_hidden") ? cat(", MLP ", shape.at("ffn_hidden")) : "";
  std::printf(
      "blutrain train: %s (%s: %d layers, %s, width %d%s, context %d, vocab %d padded to %d): %.2fM "
      "parameters\n",
      (o.config.empty() ? "embedded default, preset " + cfg.preset
                        : "config " + o.config + ", preset " + cfg.preset)
          .c_str(),
      mc.arch.c_str(), static_cast<int>(mc.n_layer), heads.c_str(), static_cast<int>(mc.n_embd), ffn.c_str(),
      static_cast<int>(mc.seq_len), static_cast<int>(mc.vocab_size), static_cast<int>(mc.padded_vocab()),
      static_cast<double>(mc.num_params()) / 1e6);
  std::printf("  device %s, precision %s | data: %zu shard(s), %.2fM tokens, %lld batches/epoch%s\n",
              tr.device().str().c_str(), t.precision.c_str(), data.shards().size(),
              static_cast<double>(data_tokens) / 1e6, static_cast<long long>(data.batches_per_epoch()),
              tr.has_val() ? ", with validation" : "");
  if (w.size > 1)
    std::printf("  %d ranks (%s), dist.strategy %s: each rank runs %lld micro-batches of %lld per step\n",
                w.size, w.launched_by.c_str(), cfg.dist.strategy.c_str(),
                static_cast<long long>(tr.grad_accum()), static_cast<long long>(t.micro_batch));
  const std::string split = cfg0.batch_split_note(w.size);
  if (!split.empty()) std::printf("  note: %s\n", split.c_str());
  std::printf(
      "  %lld steps of %lld sequences (%lld micro-batches of %lld) = %lld tokens/step, lr %.2e -> %.2e, "
      "warmup %lld\n",
      static_cast<long long>(t.steps), static_cast<long long>(t.batch_size),
      static_cast<long long>(tr.grad_accum() * w.size), static_cast<long long>(t.micro_batch),
      static_cast<long long>(t.batch_size * mc.seq_len), t.lr, t.min_lr,
      static_cast<long long>(t.warmup_steps));
  std::fflush(stdout);

  // MFU against the peak of every GPU of the job (tokens/s counts all ranks).
  std::optional<double> peak = peak_flops(tr.device(), parse_precision(t.precision));
  if (peak) *peak *= w.size;
  Progress progress(t.steps, t.log_every, mc.flops_per_token(mc.seq_len), peak);
  Heartbeat beat(w);  // for `blutrain launch`'s hang watchdog
  beat.beat("resuming (train.resume=" + t.resume + ")");
  const std::string resumed = resume(tr);
  if (!resumed.empty()) std::printf("%s\n", resumed.c_str());
  // A resumed run appends: the file then holds every step of the job.
  MetricsWriter metrics(lead ? t.metrics : std::string(), tr.counters().step > 0);
  const nlohmann::json resolved_json = nlohmann::json::parse(config_to_json(cfg0, w.size));
  const int64_t last_step = t.stop_at_step > 0 ? std::min(t.stop_at_step, t.steps) : t.steps;
  const train::TrainerCounters start = tr.counters();
  std::unique_ptr<Checkpointer> checkpointer;
  if (!cfg.checkpoint.dir.empty()) {
    checkpointer = std::make_unique<Checkpointer>(tr, resolved_json);
    install_stop_handlers();  // Note [Stop requests]
  }
  std::optional<double> last_val;
  double last_loss = 0;
  int64_t skipped = 0;     // steps train.nonfinite=skip skipped in this run
  int64_t stopped_at = 0;  // the step after which a stop request ended the run
  for (int64_t i = start.step; i < last_step && stopped_at == 0; ++i) {
    beat.beat(fmt::format("training step {} of {}", i + 1, t.steps));
    const train::StepStats s = tr.step();
    if (const std::string n = tr.take_notice(); !n.empty()) progress.print(n);
    progress.on_step(s);
    if (!s.skipped) last_loss = s.loss;  // a skipped step (train.nonfinite=skip) printed its notice
    skipped = s.skipped_steps;
    std::optional<double> val;
    const bool eval_now =
        tr.has_val() && ((t.eval_every > 0 && s.step % t.eval_every == 0) || s.step == t.steps);
    if (eval_now) {
      beat.beat(fmt::format("evaluating after step {}", s.step));
      val = tr.evaluate();
      last_val = val;
      progress.print(fmt::format("step {}: val loss {:.4f} (uniform over the vocabulary: {:.2f})", s.step,
                                 *val, std::log(static_cast<double>(mc.vocab_size))));
    }
    metrics.write(s, val);
    const train::CheckpointOptions& ck = cfg.checkpoint;
    if (checkpointer) {
      beat.beat(fmt::format("after step {}: stop-request check", s.step));
      std::string line = checkpointer->poll();
      const bool stop = stop_agreed(w);
      // A second beat once the ranks agreed: a stop request from now on is the
      // next step's, which the supervision tests rely on (they signal a rank
      // when they read this line).
      beat.beat(fmt::format("after step {}: checkpoint", s.step));
      if ((ck.every > 0 && s.step % ck.every == 0) || s.step == last_step || stop)
        line += (line.empty() ? "" : "\n") + checkpointer->save();
      if (!line.empty()) progress.print(line);
      if (stop && s.step < last_step) stopped_at = s.step;
    }
  }
  if (checkpointer) {
    const std::string line = checkpointer->flush();
    if (!line.empty()) progress.print(line);
  }
  if (stopped_at > 0) {
    std::printf(
        "stopped after step %lld of %lld: %s asked the job to stop; the checkpoint of step %lld is in %s "
        "(exit status %d: restart with train.resume=auto)\n",
        static_cast<long long>(stopped_at), static_cast<long long>(t.steps), stop_signal_name().c_str(),
        static_cast<long long>(stopped_at), cfg.checkpoint.dir.c_str(), kExitStopped);
    std::fflush(stdout);
    trainer.reset();
    dist::finalize_world();
    return kExitStopped;
  }
  if (last_step < t.steps) {
    std::printf("stopped after step %lld of %lld (train.stop_at_step)%s\n", static_cast<long long>(last_step),
                static_cast<long long>(t.steps),
                cfg.checkpoint.dir.empty() ? "" : "; resume with train.resume=auto");
  }

  beat.beat("finishing: final weights and sample");
  tr.finish_training();  // every rank: zero3 gathers the full parameters
  if (!t.save_weights.empty()) {
    save_model(t.save_weights, model);
    std::printf("saved weights to %s\n", t.save_weights.c_str());
  }
  std::printf("done: %lld steps in %s%s, %.0f tokens/s (steady), train loss %.4f%s, peak memory %s\n",
              static_cast<long long>(last_step - start.step), human_duration(progress.elapsed()).c_str(),
              skipped > 0 ? fmt::format(" ({} skipped: not finite)", skipped).c_str() : "",
              progress.mean_tokens_per_s(), last_loss,
              last_val ? fmt::format(", val loss {:.4f}", *last_val).c_str() : "",
              human_bytes(train::peak_memory_bytes(tr.device())).c_str());
  if (sample) {
    // The run has finished: a sample that fails now is reported, not the run.
    try {
      print_sample(model, *sample, t.sample_tokens, t.sample_temperature, t.sample_top_k, t.seed);
    } catch (const std::exception& e) {
      std::printf("no sample: %s (the run itself finished)\n", e.what());
    }
  }
  if (!lead)
    std::fprintf(stderr, "rank %d: done, %lld steps, train loss %.4f\n", w.rank,
                 static_cast<long long>(t.steps), last_loss);
  trainer.reset();  // its process group goes before MPI does
  dist::finalize_world();
  return 0;
}

}  // namespace bt::launcher
