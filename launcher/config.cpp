#include "launcher/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <optional>
#include <sstream>
#include <variant>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "kernels/common/error.h"
#include "runtime/core/printable.h"
#include "runtime/data/unicode.h"
#include "runtime/nn/registry.h"

namespace bt::launcher {
namespace {

using train::TrainConfig;
using Ref = std::variant<int64_t*, uint64_t*, double*, bool*, std::string*>;

struct Key {
  const char* name;  // "section.key"
  std::function<Ref(TrainConfig&)> get;
  const char* help;
};

#define BT_KEY(name, member, help)                              \
  Key {                                                         \
    name, [](TrainConfig& c) -> Ref { return &c.member; }, help \
  }

/// Every key a config may set. model.preset is applied first (it picks the
/// defaults of the other model.* keys); see load_train_config.
const std::vector<Key>& keys() {
  static const std::vector<Key> k = {
      BT_KEY(
          "model.preset", preset,
          "tiny | gpt2-124m | llama-tiny | llama-150m: defaults for the other model.* keys (and model.arch)"),
      BT_KEY("model.arch", model.arch,
             "gpt2 | llama: the model family (alone, it picks the family's small preset: tiny, llama-tiny)"),
      BT_KEY("model.n_layer", model.n_layer, "transformer blocks"),
      BT_KEY("model.n_head", model.n_head, "attention heads (must divide n_embd)"),
      BT_KEY("model.n_embd", model.n_embd, "model width"),
      BT_KEY("model.seq_len", model.seq_len, "context length T (training sequence length)"),
      BT_KEY("model.vocab_size", model.vocab_size, "real vocabulary (padded to a multiple of 128)"),
      BT_KEY("model.n_kv_head", model.n_kv_head,
             "llama: K/V heads of grouped-query attention (must divide n_head; 0: n_head)"),
      BT_KEY("model.ffn_hidden", model.ffn_hidden,
             "llama: SwiGLU hidden width (0: 8 n_embd / 3 rounded up to a multiple of 64)"),
      BT_KEY("model.rope_theta", model.rope_theta, "llama: RoPE base"),
      BT_KEY("model.norm_eps", model.norm_eps, "epsilon of LayerNorm (gpt2) and RMSNorm (llama)"),
      BT_KEY("model.tie_embeddings", model.tie_embeddings,
             "the LM head is the token embedding (gpt2: always; llama presets: false)"),
      BT_KEY("model.fused_ops", model.fused_ops,
             "gpt2: false = the same model written from primitive ops (LayerNorm, GELU, bias and residual "
             "adds), for train.compile to fuse (llama's glue is always primitive ops)"),
      BT_KEY("data.train", data.train, "glob of llm.c token shards to train on"),
      BT_KEY("data.val", data.val, "glob of validation shards (empty: no validation)"),
      BT_KEY("data.shuffle", data.shuffle, "shuffle training windows each epoch"),
      BT_KEY("data.tokenizer", data.tokenizer, "folder with encoder.json and vocab.bpe (for samples)"),
      BT_KEY("train.steps", train.steps, "optimizer steps"),
      BT_KEY("train.batch_size", train.batch_size, "global sequences per optimizer step"),
      BT_KEY("train.micro_batch", train.micro_batch,
             "most sequences per forward pass per rank (less when it does not split train.batch_size)"),
      BT_KEY("train.lr", train.lr, "peak learning rate"),
      BT_KEY("train.min_lr", train.min_lr, "floor of the cosine decay"),
      BT_KEY("train.warmup_steps", train.warmup_steps, "linear warmup steps"),
      BT_KEY("train.weight_decay", train.weight_decay, "AdamW decay on 2-D parameters"),
      BT_KEY("train.beta1", train.beta1, "AdamW beta1"),
      BT_KEY("train.beta2", train.beta2, "AdamW beta2"),
      BT_KEY("train.eps", train.eps, "AdamW epsilon"),
      BT_KEY("train.grad_clip", train.grad_clip, "global gradient-norm clip (0: off)"),
      BT_KEY("train.nonfinite", train.nonfinite,
             "stop | skip: a step whose loss or gradient is not finite never updates; stop ends the run, "
             "skip goes on to the next batch"),
      BT_KEY("train.max_skipped_steps", train.max_skipped_steps,
             "train.nonfinite=skip: most steps skipped in a row; one more ends the run"),
      BT_KEY("train.device", train.device, "auto | cpu | cuda | cuda:N"),
      BT_KEY("train.precision", train.precision, "fp32 | tf32 | fp32x3 | bf16"),
      BT_KEY("train.recompute", train.recompute,
             "auto | none | selective | full: activations backward rebuilds instead of keeping "
             "(auto: selective under bf16, else none)"),
      BT_KEY("train.cuda_graph", train.cuda_graph,
             "CUDA: after two eager steps, capture the step as a CUDA graph and replay it (one process)"),
      BT_KEY("train.compile", train.compile,
             "auto | true | false: fuse the step's elementwise and reduction regions into compiled kernels "
             "(needs MLIR 19; BT_COMPILE=0 turns it off; see docs/compiler.md); auto: on for llama on CUDA"),
      BT_KEY("train.seed", train.seed, "seed of the init, the data order and sampling"),
      BT_KEY("train.eval_every", train.eval_every, "steps between validation passes (0: at the end only)"),
      BT_KEY("train.eval_batches", train.eval_batches, "micro-batches per validation pass"),
      BT_KEY("train.log_every", train.log_every, "steps between plain progress lines"),
      BT_KEY("train.sample_tokens", train.sample_tokens, "tokens sampled at the end (0: none)"),
      BT_KEY("train.sample_prompt", train.sample_prompt, "prompt of the final sample"),
      BT_KEY("train.sample_temperature", train.sample_temperature, "sampling temperature"),
      BT_KEY("train.sample_top_k", train.sample_top_k, "sample from the k likeliest tokens (0: all)"),
      BT_KEY("train.save_weights", train.save_weights, "HDF5 weights file written at the end"),
      BT_KEY("train.metrics", train.metrics, "JSONL file of per-step metrics (a resumed run appends)"),
      BT_KEY("dist.strategy", dist.strategy, "ddp | zero1 | zero2 | zero3 (jobs of several ranks)"),
      BT_KEY("dist.bucket_mb", dist.bucket_mb, "DDP gradient bucket size in MiB"),
      BT_KEY("dist.timeout_s", dist.timeout_s, "seconds before a stuck collective aborts the job"),
      BT_KEY("dist.insecure", dist.insecure,
             "torchrun-style jobs: run the rendezvous without a job token (BT_JOB_TOKEN); trusted networks "
             "only"),
      BT_KEY("train.resume", train.resume,
             "none | auto (latest in checkpoint.dir) | a checkpoint, or a root (its latest)"),
      BT_KEY("train.stop_at_step", train.stop_at_step, "end this run after this step (0: train.steps)"),
      BT_KEY("checkpoint.dir", checkpoint.dir, "where step_XXXXXXXX/ checkpoints go (empty: none)"),
      BT_KEY("checkpoint.every", checkpoint.every, "steps between checkpoints (0: at the end of the run)"),
      BT_KEY("checkpoint.keep_last", checkpoint.keep_last, "checkpoints kept (0: all)"),
      BT_KEY("checkpoint.keep_every", checkpoint.keep_every,
             "also keep every checkpoint whose step divides by this"),
      BT_KEY("checkpoint.async", checkpoint.async,
             "write checkpoints on a background thread while training goes on"),
      BT_KEY("compile.dump", compile.dump,
             "folder where each fusion group's stages are written (empty: none)"),
      BT_KEY("compile.check", compile.check,
             "run each newly compiled group eagerly too and report the largest relative difference"),
      BT_KEY("compile.cache_dir", compile.cache_dir,
             "folder of the on-disk kernel cache (empty: $XDG_CACHE_HOME/blutrain/kernels, else "
             "~/.cache/blutrain/kernels; off: none, kernels compile in memory)"),
  };
  return k;
}
#undef BT_KEY

/// Keys that existed once, with why each went: a config that still sets one
/// fails with that reason, not as an unknown key with a guess.
struct RetiredKey {
  const char* name;
  const char* why;
};
constexpr RetiredKey kRetiredKeys[] = {
    {"train.deterministic",
     "runs are always bitwise reproducible for a given build, device kind, world size and config "
     "(Note [Deterministic by construction] in runtime/train/trainer.h)"},
};

const Key* find_key(const std::string& name) {
  for (const Key& k : keys())
    if (name == k.name) return &k;
  return nullptr;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> d(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) d[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t prev = d[0];
    d[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cur = d[j];
      d[j] = std::min({d[j] + 1, d[j - 1] + 1, prev + (a[i - 1] == b[j - 1] ? 0 : 1)});
      prev = cur;
    }
  }
  return d[b.size()];
}

[[noreturn]] void unknown_key(const std::string& name, const std::string& where) {
  for (const RetiredKey& r : kRetiredKeys)
    BT_CHECK(name != r.name, "config key '", name, "' in ", where, " was removed: ", r.why,
             "; remove the key");
  const Key* best = nullptr;
  size_t best_d = 4;
  for (const Key& k : keys())
    if (const size_t d = edit_distance(name, k.name); d < best_d) best = &k, best_d = d;
  BT_FAIL("unknown config key '", name, "' in ", where,
          best ? cat("; did you mean '", best->name, "'?") : std::string(),
          " (`blutrain train --help` lists every key)");
}

std::string scalar_text(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  std::ostringstream os;
  os << YAML::Dump(n);
  return os.str();
}

/// Whether `s` is UTF-8 of YAML's printable characters, Unicode's
/// noncharacters excepted: the resolved config is also written as JSON
/// (config_to_json, UTF-8 only) and as YAML (config_to_yaml, which must read
/// back to the same string; yaml-cpp reads a noncharacter as U+FFFD).
bool yaml_printable(const std::string& s) {
  for (const char* p = s.data(); p < s.data() + s.size();) {
    const unicode::Utf8Char u = unicode::decode_utf8(p, s.data() + s.size());
    const char32_t c = u.cp;
    const bool allowed = c == 0x9 || c == 0xA || c == 0xD || (c >= 0x20 && c <= 0x7E) || c == 0x85 ||
                         (c >= 0xA0 && c <= 0xD7FF) || (c >= 0xE000 && c <= 0x10FFFF);
    const bool noncharacter = (c >= 0xFDD0 && c <= 0xFDEF) || (c & 0xFFFE) == 0xFFFE;
    if (!u.valid || !allowed || noncharacter) return false;
    p += u.len;
  }
  return true;
}

/// Stores YAML value `n` into key `k` of `c`; errors name the key and the value.
void assign(TrainConfig& c, const Key& k, const YAML::Node& n, const std::string& where) {
  const std::string text = scalar_text(n);
  BT_CHECK(n.IsScalar() || n.IsNull(), "config key '", k.name, "' in ", where,
           " must be a single value, got '", text, "'");
  auto bad = [&](const char* type) {
    BT_FAIL("config key '", k.name, "' in ", where, " must be ", type, ", got '", text, "'");
  };
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string>) {
          *p = n.IsNull() ? std::string() : n.Scalar();
          BT_CHECK(yaml_printable(*p), "config key '", k.name, "' in ", where,
                   " must be printable UTF-8 text (tabs and line breaks allowed), got '", printable(*p, 80),
                   "'");
        } else if constexpr (std::is_same_v<T, bool>) {
          if (n.IsNull() || !YAML::convert<bool>::decode(n, *p)) bad("true or false");
        } else if constexpr (std::is_same_v<T, double>) {
          if (n.IsNull() || !YAML::convert<double>::decode(n, *p) || !std::isfinite(*p))
            bad("a finite number");
        } else {
          // Integers; "1e3"-style values are accepted when they are whole.
          const char* what = std::is_same_v<T, uint64_t> ? "a non-negative integer" : "an integer";
          double d = 0;
          if (n.IsNull() || !YAML::convert<double>::decode(n, d) || d != std::floor(d) ||
              (std::is_unsigned_v<T> && d < 0) || std::fabs(d) > 9.007199254740992e15)
            bad(what);
          if (!YAML::convert<T>::decode(n, *p) || static_cast<double>(*p) != d) *p = static_cast<T>(d);
        }
      },
      k.get(c));
}

/// Flattens the two-level YAML document into "section.key" -> value.
std::vector<std::pair<std::string, YAML::Node>> flatten(const YAML::Node& root, const std::string& where) {
  std::vector<std::pair<std::string, YAML::Node>> out;
  if (!root || root.IsNull()) return out;
  BT_CHECK(root.IsMap(), where,
           " must be a YAML mapping of sections (model:, data:, train:, dist:, checkpoint:, compile:)");
  for (const auto& sec : root) {
    BT_CHECK(sec.first.IsScalar(), "config section names in ", where, " must be plain words, got '",
             scalar_text(sec.first), "'");
    const std::string s = sec.first.Scalar();
    BT_CHECK(
        s == "model" || s == "data" || s == "train" || s == "dist" || s == "checkpoint" || s == "compile",
        "unknown config section '", s, "' in ", where,
        "; the sections are model, data, train, dist, checkpoint and compile");
    if (sec.second.IsNull()) continue;
    BT_CHECK(sec.second.IsMap(), "config section '", s, "' in ", where, " must be a mapping of keys");
    for (const auto& kv : sec.second) {
      BT_CHECK(kv.first.IsScalar(), "config keys of section '", s, "' in ", where,
               " must be plain words, got '", scalar_text(kv.first), "'");
      out.emplace_back(s + "." + kv.first.Scalar(), kv.second);
    }
  }
  return out;
}

train::TrainConfig embedded_default() {
  TrainConfig c;
  c.preset = "tiny";
  c.model = nn::model_preset("tiny");
  c.data.train = "data/jargon/tok/prose_train_*.bin";  // made by scripts/prepare-jargon
  c.data.val = "data/jargon/tok/prose_val_*.bin";
  // Sized for a 2-core CPU: 250 steps of 8 x 256 tokens (~6 minutes at ~1.5K
  // tokens/s), with a learning rate fit for so short a run.
  c.train.steps = 250;
  c.train.batch_size = 8;
  c.train.micro_batch = 8;
  c.train.lr = 2e-3;
  c.train.min_lr = 2e-4;
  c.train.warmup_steps = 20;
  c.train.eval_every = 50;
  c.train.sample_prompt = "The hacker";
  return c;
}

}  // namespace

train::TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides,
                                     int world) {
  std::vector<std::pair<std::string, YAML::Node>> entries;
  std::vector<std::string> origin;
  if (!path.empty()) {
    BT_CHECK(std::filesystem::is_regular_file(path), "config file '", path,
             "' does not exist; see configs/ for examples (configs/tiny.yaml, configs/gpt2-124m.yaml)");
    YAML::Node root;
    try {
      root = YAML::LoadFile(path);
    } catch (const YAML::Exception& e) {
      BT_FAIL("config file '", path, "' is not valid YAML: ", e.what());
    }
    for (auto& e : flatten(root, "'" + path + "'")) {
      entries.push_back(e);
      origin.push_back("'" + path + "'");
    }
  }
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    BT_CHECK(eq != std::string::npos && eq > 0, "--set '", o, "' must look like section.key=value");
    YAML::Node v;
    try {
      v = YAML::Load(o.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      BT_FAIL("--set '", o, "': the value is not valid YAML: ", e.what());
    }
    entries.emplace_back(o.substr(0, eq), v);
    origin.push_back("--set " + o);
  }

  TrainConfig c = embedded_default();
  // model.preset first: it resets the model.* defaults that later keys
  // override. Without one, model.arch picks its family's first preset.
  const auto last_of = [&](const char* key) {
    std::optional<size_t> at;
    for (size_t i = 0; i < entries.size(); ++i)
      if (entries[i].first == key) at = i;
    return at;
  };
  const std::optional<size_t> preset_at = last_of("model.preset"), arch_at = last_of("model.arch");
  if (preset_at || arch_at) {
    const size_t i = preset_at ? *preset_at : *arch_at;
    std::string arch;
    if (arch_at) {
      TrainConfig probe;
      assign(probe, *find_key("model.arch"), entries[*arch_at].second, origin[*arch_at]);
      arch = probe.model.arch;
    }
    try {
      if (preset_at)
        assign(c, *find_key("model.preset"), entries[i].second, origin[i]);
      else
        c.preset = nn::family(arch).presets.front().first;
      c.model = nn::model_preset(c.preset);
    } catch (const Error& e) {
      BT_FAIL(e.what(), " (in ", origin[i], ")");
    }
    BT_CHECK(!arch_at || arch == c.model.arch, "model.arch=", arch, " (in ", origin[*arch_at],
             ") does not match model.preset=", c.preset, ", a ", c.model.arch, " preset; choose a ", arch,
             " preset or drop one of the two");
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    const Key* k = find_key(entries[i].first);
    if (k == nullptr) unknown_key(entries[i].first, origin[i]);
    if (entries[i].first != "model.preset") assign(c, *k, entries[i].second, origin[i]);
  }
  c.validate(world);
  return c;
}

std::string config_to_json(const train::TrainConfig& c0, int world) {
  TrainConfig c = c0;
  nlohmann::ordered_json j;
  for (const Key& k : keys()) {
    const std::string name = k.name;
    const size_t dot = name.find('.');
    auto& slot = j[name.substr(0, dot)][name.substr(dot + 1)];
    std::visit([&](auto* p) { slot = *p; }, k.get(c));
  }
  j["model"]["padded_vocab"] = c.model.padded_vocab();
  j["train"]["micro_batch"] = c.micro_batch_for(world);  // what the job runs (Note [Batch split])
  j["train"]["grad_accum"] = c.grad_accum(world);
  j["train"]["world_size"] = world;
  return j.dump(2);
}

std::string config_to_yaml(const train::TrainConfig& c0) {
  TrainConfig c = c0;
  auto section_of = [](const Key& k) { return std::string(k.name).substr(0, std::string(k.name).find('.')); };
  std::vector<std::string> sections;  // in the order the table first names them
  for (const Key& k : keys())
    if (std::find(sections.begin(), sections.end(), section_of(k)) == sections.end())
      sections.push_back(section_of(k));
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const std::string& section : sections) {
    out << YAML::Key << section << YAML::Value << YAML::BeginMap;
    for (const Key& k : keys()) {
      if (section_of(k) != section) continue;
      out << YAML::Key << std::string(k.name).substr(section.size() + 1) << YAML::Value;
      std::visit(
          [&](auto* p) {
            using T = std::remove_pointer_t<decltype(p)>;
            if constexpr (std::is_same_v<T, std::string>)
              out << YAML::DoubleQuoted << *p;
            else if constexpr (std::is_same_v<T, double>)
              out << fmt::format("{:.17g}", *p);  // reads back to the same double
            else
              out << *p;
          },
          k.get(c));
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::string config_keys_help() {
  TrainConfig c = embedded_default();
  std::ostringstream os;
  for (const Key& k : keys()) {
    std::string def;
    std::visit(
        [&](auto* p) {
          using T = std::remove_pointer_t<decltype(p)>;
          if constexpr (std::is_same_v<T, std::string>)
            def = "'" + *p + "'";
          else if constexpr (std::is_same_v<T, bool>)
            def = *p ? "true" : "false";
          else
            def = cat(*p);
        },
        k.get(c));
    os << "  " << k.name
       << std::string(k.name ? std::max<size_t>(2, 26 - std::string(k.name).size()) : 2, ' ') << k.help
       << " [default " << def << "]\n";
  }
  return os.str();
}

}  // namespace bt::launcher
