#include "launcher/checkpointing.h"

#include <cstdio>

#include "checkpoint/checkpoint.h"
#include "kernels/common/error.h"

namespace bt::launcher {
namespace {

std::map<std::string, int64_t> job_counters(const train::TrainerCounters& c) {
  return {{"step", c.step},
          {"optimizer_steps", c.optimizer_steps},
          {"data_epoch", c.data_epoch},
          {"data_samples", c.data_samples}};
}

train::TrainerCounters counters_of(const ckpt::Index& idx, int rank, const std::string& dir) {
  auto get = [&](const std::map<std::string, int64_t>& m, const char* k) {
    auto it = m.find(k);
    BT_CHECK(it != m.end(), "checkpoint '", dir, "': its index has no counter '", k, "'; it is corrupt");
    return it->second;
  };
  train::TrainerCounters c;
  c.step = get(idx.counters, "step");
  c.optimizer_steps = get(idx.counters, "optimizer_steps");
  c.data_epoch = get(idx.counters, "data_epoch");
  c.data_samples = get(idx.counters, "data_samples");
  // This rank's RNG state; a rank the saving job did not have takes rank 0's.
  const ckpt::RankRecord& r = idx.ranks.at(rank < static_cast<int>(idx.ranks.size()) ? rank : 0);
  c.rng_seed = static_cast<uint64_t>(get(r.counters, "rng_seed"));
  c.rng_offset = static_cast<uint64_t>(get(r.counters, "rng_offset"));
  return c;
}

/// Loads `dir` into `tr` on every rank; false (with the reason in `why`) when
/// any rank could not read it. Incompatible checkpoints throw.
bool try_load(train::Trainer& tr, const std::string& dir, std::string& why) {
  bool ok = true;
  ckpt::Index idx;
  try {
    idx = ckpt::read_index(dir);
    ckpt::load_pieces(dir, idx, tr.state_pieces(false));
  } catch (const ckpt::Incompatible&) {
    throw;
  } catch (const Error& e) {
    ok = false;
    why = e.what();
  }
  if (!tr.all_ranks(ok)) {
    if (why.empty()) why = "another rank could not read it (see that rank's log)";
    return false;
  }
  tr.restore(counters_of(idx, tr.rank(), dir));
  why = cat("saved at step ", idx.step, " by ", idx.world_size, " rank(s) with strategy ", idx.strategy);
  return true;
}

}  // namespace

std::string save_checkpoint(train::Trainer& tr, const nlohmann::json& resolved_config) {
  const train::TrainConfig& cfg = tr.config();
  const train::TrainerCounters c = tr.counters();
  ckpt::SaveRequest r;
  r.root = cfg.checkpoint.dir;
  r.step = c.step;
  r.pieces = tr.state_pieces(true);
  r.counters = job_counters(c);
  r.rank_counters = {{"rng_seed", static_cast<int64_t>(c.rng_seed)},
                     {"rng_offset", static_cast<int64_t>(c.rng_offset)}};
  r.config = resolved_config;
  r.strategy = tr.strategy().name();
  r.device = tr.device().str();
  r.keep_last = cfg.checkpoint.keep_last;
  r.keep_every = cfg.checkpoint.keep_every;
  return ckpt::save(r, tr.process_group());
}

std::string resume(train::Trainer& tr) {
  const train::TrainConfig& cfg = tr.config();
  const std::string& how = cfg.train.resume;
  if (how == "none") return "";
  if (how != "auto") {  // one named checkpoint: no fallback
    std::string why;
    if (!try_load(tr, how, why)) BT_FAIL("cannot resume from checkpoint '", how, "': ", why);
    return cat("resumed from ", how, " (", why, ")");
  }
  std::vector<std::string> all = ckpt::list(cfg.checkpoint.dir);
  if (all.empty()) return cat("no checkpoint in ", cfg.checkpoint.dir, " yet: starting from step 0");
  // Newest first, from the one `latest` names (the newest complete one).
  const std::string first = ckpt::latest(cfg.checkpoint.dir);
  std::string notes;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (*it > first) continue;
    std::string why;
    if (try_load(tr, *it, why)) return cat(notes, "resumed from ", *it, " (", why, ")");
    notes += cat("checkpoint ", *it, " is unusable (", why, "); trying the one before\n");
  }
  BT_FAIL(notes, "no usable checkpoint in ", cfg.checkpoint.dir,
          "; remove the damaged ones or set train.resume=none to start over");
}

}  // namespace bt::launcher
