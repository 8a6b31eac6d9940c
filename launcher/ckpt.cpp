// `blutrain ckpt ls ROOT | inspect CKPT | verify [--all] CKPT | export CKPT OUT.h5 [--llmc OUT.bin]`:
// looks at the checkpoints `blutrain train` writes (checkpoint/checkpoint.h).
// CKPT is one checkpoint (ROOT/step_XXXXXXXX) or a root, which stands for its
// latest (said on the first line); verify --all ROOT checks every one.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/checkpoint.h"
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "launcher/model_file.h"
#include "launcher/progress.h"
#include "runtime/nn/registry.h"

namespace bt::launcher {
namespace {

namespace fs = std::filesystem;

int ls(const std::string& root) {
  const std::vector<std::string> all = ckpt::list(root);
  if (all.empty()) {
    std::printf("no complete checkpoint in %s\n", root.c_str());
    return 1;
  }
  const std::string latest = ckpt::latest(root);
  std::printf("%-16s %8s %6s %-9s %10s\n", "checkpoint", "step", "ranks", "strategy", "size");
  for (const std::string& d : all) {
    const ckpt::Index idx = ckpt::read_index(d);
    std::printf("%-16s %8lld %6d %-9s %10s%s\n", fs::path(d).filename().c_str(),
                static_cast<long long>(idx.step), idx.world_size, idx.strategy.c_str(),
                human_bytes(ckpt::bytes_on_disk(d)).c_str(), d == latest ? "  <- latest" : "");
  }
  return 0;
}

int inspect(const std::string& dir) {
  const ckpt::Index idx = ckpt::read_index(dir);
  std::printf("%s: step %lld, saved by %d rank(s), strategy %s\n", dir.c_str(),
              static_cast<long long>(idx.step), idx.world_size, idx.strategy.c_str());
  for (const auto& [k, v] : idx.counters) std::printf("  %s = %lld\n", k.c_str(), static_cast<long long>(v));
  for (const ckpt::RankRecord& r : idx.ranks)
    std::printf("  rank %d: %s on %s\n", r.rank, r.file.c_str(), r.device.c_str());
  std::printf("  %zu tensors:\n", idx.tensors.size());
  for (const auto& [name, t] : idx.tensors)
    std::printf("    %-40s %-16s %zu piece(s)\n", name.c_str(), shape_str(t.shape).c_str(), t.pieces.size());
  return 0;
}

/// The checkpoint `path` names (itself, or a root's latest, said on stdout).
std::string chosen(const std::string& path) {
  std::string line;
  const std::string dir = ckpt::resolve(path, &line);
  if (!line.empty()) std::printf("%s\n", line.c_str());
  return dir;
}

int verify(const std::string& dir, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> problems = ckpt::verify(dir);
  problems.insert(problems.end(), extra.begin(), extra.end());
  if (problems.empty()) {
    const ckpt::Index idx = ckpt::read_index(dir);
    size_t pieces = 0;
    for (const auto& [n, t] : idx.tensors) pieces += t.pieces.size();
    std::printf("%s: ok (%zu tensors, %zu pieces, every checksum matches)\n", dir.c_str(), idx.tensors.size(),
                pieces);
    return 0;
  }
  for (const std::string& p : problems) std::fprintf(stderr, "%s: %s\n", dir.c_str(), p.c_str());
  std::fprintf(stderr, "%s: %zu problem(s); do not resume from it\n", dir.c_str(), problems.size());
  return 1;
}

/// verify PATH: the checkpoint, or a root's latest, whose `latest` file must
/// then be sound too (a damaged one would send a resume elsewhere).
int verify_path(const std::string& path) {
  std::string line;
  const std::string dir = ckpt::resolve(path, &line);
  std::vector<std::string> extra;
  if (!line.empty()) {  // a root: resolve said which checkpoint it took
    std::printf("%s\n", line.c_str());
    const std::string p = ckpt::latest_pointer_problem(path);
    if (!p.empty()) extra.push_back(p);
  }
  return verify(dir, extra);
}

/// verify --all ROOT: every complete checkpoint, and `latest`.
int verify_all(const std::string& root) {
  const std::vector<std::string> all = ckpt::list(root);
  BT_CHECK(!all.empty(), "verify --all: '", root,
           "' holds no complete checkpoint (no step_XXXXXXXX/ with an ",
           "index.json); give the checkpoint.dir of a run that saved one");
  int bad = 0;
  for (const std::string& d : all) bad += verify(d) != 0;
  const std::string p = ckpt::latest_pointer_problem(root);
  if (!p.empty()) std::fprintf(stderr, "%s: %s\n", root.c_str(), p.c_str());
  const bool ok = bad == 0 && p.empty();
  std::fprintf(ok ? stdout : stderr, "%s: %zu checkpoint(s), %d with problems%s\n", root.c_str(), all.size(),
               bad, p.empty() ? "" : ", and a damaged `latest`");
  return ok ? 0 : 1;
}

/// The model a checkpoint's resolved config describes, on the CPU, holding
/// the checkpoint's f32 master weights.
std::unique_ptr<nn::Model> model_of(const std::string& dir, const ckpt::Index& idx) {
  const std::string where = "checkpoint '" + dir + "'";
  const auto m = idx.config.find("model");
  BT_CHECK(m != idx.config.end() && m->is_object(), where, ": its config has no model section");
  const nn::ModelConfig c = nn::model_config_from_json(m->dump(), where);
  c.validate(where + ": model");
  auto model = nn::family(c.arch).make(c, Device::cpu(), 0);
  std::vector<dist::StatePiece> pieces;
  for (const auto& [name, t] : model->named_parameters())
    pieces.push_back({"param/" + name, t.shape(), 0, t.numel(), t.reshape({-1})});
  ckpt::load_pieces(dir, idx, pieces);
  return model;
}

/// llm.c's GPT-2 checkpoint: a 256 x int32 header (magic 20240326, version 3
/// = float32, maxT, V, L, NH, C, Vp) and the parameters as float32 in llm.c's
/// order, each kind stacked over the layers.
void write_llmc(const std::string& path, const nn::Model& m) {
  const nn::ModelConfig& c = m.config();
  BT_ASSERT(m.arch() == "gpt2", "llm.c's format is GPT-2's");
  std::vector<int32_t> header(256, 0);
  header[0] = 20240326;
  header[1] = 3;
  header[2] = static_cast<int32_t>(c.seq_len);
  header[3] = static_cast<int32_t>(c.vocab_size);
  header[4] = static_cast<int32_t>(c.n_layer);
  header[5] = static_cast<int32_t>(c.n_head);
  header[6] = static_cast<int32_t>(c.n_embd);
  header[7] = static_cast<int32_t>(c.padded_vocab());
  std::map<std::string, Tensor> by_name(m.named_parameters().begin(), m.named_parameters().end());
  const std::string tmp = path + ".tmp";
  std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
  BT_CHECK(f.good(), "cannot create '", tmp, "'");
  f.write(reinterpret_cast<const char*>(header.data()), 256 * sizeof(int32_t));
  auto put = [&](const std::string& name) {
    const Tensor& t = by_name.at(name);
    f.write(reinterpret_cast<const char*>(t.data<float>()),
            static_cast<std::streamsize>(t.numel() * sizeof(float)));
  };
  put("wte");
  put("wpe");
  for (const char* kind : {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                           "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                           "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"})
    for (int64_t l = 0; l < c.n_layer; ++l) put(cat("h.", l, ".", kind));
  put("ln_f.weight");
  put("ln_f.bias");
  f.flush();
  BT_CHECK(f.good(), "cannot write '", tmp, "' (disk full?)");
  f.close();
  BT_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '", tmp, "' to '", path, "'");
}

}  // namespace

int run_ckpt(int argc, char** argv) {
  cli::Options opts(
      "blutrain ckpt",
      "Checkpoints of `blutrain train` (checkpoint.dir):\n"
      "  ls ROOT                       list the complete checkpoints, the latest marked\n"
      "  inspect CKPT                  step, ranks, strategy, counters and tensors of one\n"
      "  verify [--all] CKPT           check the index is complete and every checksum matches\n"
      "                                (--all ROOT: every checkpoint under ROOT)\n"
      "  export CKPT OUT.h5 [--llmc F] the consolidated model weights (blutrain-weights HDF5,\n"
      "                                as --save-weights writes; and llm.c's format)\n"
      "CKPT is a checkpoint (ROOT/step_XXXXXXXX) or a root (checkpoint.dir): a root stands for\n"
      "its latest complete checkpoint, and the first line says which that is.");
  opts.add_options()("llmc", "also write llm.c's model file (magic 20240326) here",
                     cli::value<std::string>())("all", "verify: every checkpoint under the root")(
      "h,help", "show this help")("args", "", cli::value<std::vector<std::string>>());
  opts.parse_positional({"args"});
  opts.positional_help("ls|inspect|verify|export PATH [OUT]");
  cli::ParseResult r;
  try {
    r = opts.parse(argc, argv);
  } catch (const std::exception& e) {
    BT_FAIL(e.what(), " (see blutrain ckpt --help)");
  }
  const std::vector<std::string> a =
      r.count("args") ? r["args"].as<std::vector<std::string>>() : std::vector<std::string>{};
  if (r.count("help") || a.empty()) {
    std::printf("%s\n", opts.help().c_str());
    return a.empty() && !r.count("help") ? 2 : 0;
  }
  const std::string& verb = a[0];
  const size_t want = verb == "export" ? 3 : 2;
  BT_CHECK(verb == "ls" || verb == "inspect" || verb == "verify" || verb == "export",
           "blutrain ckpt: unknown verb '", verb, "'; use ls, inspect, verify or export");
  BT_CHECK(a.size() == want, "blutrain ckpt ", verb, ": expected ", want - 1, " path argument(s), got ",
           a.size() - 1, " (see blutrain ckpt --help)");
  BT_CHECK(!r.count("all") || verb == "verify", "blutrain ckpt ", verb, ": --all is for verify only");
  if (verb == "ls") return ls(a[1]);
  if (verb == "inspect") return inspect(chosen(a[1]));
  if (verb == "verify") return r.count("all") ? verify_all(a[1]) : verify_path(a[1]);
  const std::string dir = chosen(a[1]);
  const ckpt::Index idx = ckpt::read_index(dir);
  const std::unique_ptr<nn::Model> model = model_of(dir, idx);
  BT_CHECK(!r.count("llmc") || model->arch() == "gpt2", "blutrain ckpt export --llmc: llm.c's format holds ",
           "GPT-2 models only, and this checkpoint holds a ", model->arch(), " model; export without --llmc");
  save_model(a[2], *model);
  std::printf("wrote %s (step %lld)\n", a[2].c_str(), static_cast<long long>(idx.step));
  if (r.count("llmc")) {
    write_llmc(r["llmc"].as<std::string>(), *model);
    std::printf("wrote %s (llm.c format)\n", r["llmc"].as<std::string>().c_str());
  }
  return 0;
}

}  // namespace bt::launcher
