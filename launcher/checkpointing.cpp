#include "launcher/checkpointing.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "checkpoint/checkpoint.h"
#include "kernels/common/error.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/tensor/factory.h"

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

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Loads `dir` into `tr` on every rank; false (with the reason in `why`) when
/// any rank could not read it. Incompatible checkpoints throw.
bool try_load(train::Trainer& tr, const std::string& dir, std::string& why) {
  bool ok = true;
  ckpt::Index idx;
  const double t0 = now_s();
  double bytes = 0;
  try {
    idx = ckpt::read_index(dir);
    const std::vector<dist::StatePiece> pieces = tr.state_pieces(false);
    ckpt::load_pieces(dir, idx, pieces);
    for (const dist::StatePiece& p : pieces) bytes += 4.0 * static_cast<double>(p.end - p.begin);
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
  const double secs = now_s() - t0;
  why = fmt::format(
      "saved at step {} by {} rank(s) with strategy {}; rank {} read {:.2f} GB in {:.2f} s: {:.2f} GB/s",
      idx.step, idx.world_size, idx.strategy, tr.rank(), bytes / 1e9, secs,
      bytes / 1e9 / std::max(secs, 1e-9));
  return true;
}

std::string saved_line(const std::string& dir, double secs, const char* how) {
  const double bytes = static_cast<double>(ckpt::bytes_on_disk(dir));
  return fmt::format("saved checkpoint {} ({}, {:.2f} GB in {:.2f} s: {:.2f} GB/s)", dir, how, bytes / 1e9,
                     secs, bytes / 1e9 / std::max(secs, 1e-9));
}

}  // namespace

Checkpointer::Checkpointer(train::Trainer& tr, nlohmann::json resolved_config)
    : tr_(tr), config_(std::move(resolved_config)) {
  if (!tr_.device().is_cuda() || !tr_.config().checkpoint.async) return;
  side_ = Stream::create(tr_.device());
  // The snapshot's pinned buffers are pinned now, not in the first save's
  // step (about a second for GPT-2 124M's 1.5 GB): held together, then freed
  // into the pinned allocator's cache, whose size classes the snapshot's
  // copies then hit.
  NoGradGuard ng;
  std::vector<Tensor> warm;
  for (const dist::StatePiece& p : tr_.state_pieces(true))
    warm.push_back(
        empty(p.data.shape(), TensorOptions{p.data.dtype(), Device::cpu(), false, /*pinned=*/true}));
}

Checkpointer::~Checkpointer() {
  // An exception is unwinding the run: a pending write may finish, but it is
  // not committed (the next save removes its .tmp directory).
  if (writer_.pending()) writer_.wait();
}

ckpt::SaveRequest Checkpointer::request() const {
  const train::TrainConfig& cfg = tr_.config();
  const train::TrainerCounters c = tr_.counters();
  ckpt::SaveRequest r;
  r.root = cfg.checkpoint.dir;
  r.step = c.step;
  r.pieces = tr_.state_pieces(true);
  r.counters = job_counters(c);
  r.rank_counters = {{"rng_seed", static_cast<int64_t>(c.rng_seed)},
                     {"rng_offset", static_cast<int64_t>(c.rng_offset)}};
  r.config = config_;
  r.strategy = tr_.strategy().name();
  r.device = tr_.device().str();
  r.keep_last = cfg.checkpoint.keep_last;
  r.keep_every = cfg.checkpoint.keep_every;
  return r;
}

std::string Checkpointer::save() {
  const double t0 = now_s();
  if (!tr_.config().checkpoint.async) {
    const std::string dir = ckpt::save(request(), tr_.process_group());
    return saved_line(dir, now_s() - t0, "synchronous");
  }
  std::string notes = finish(/*block=*/true);  // the previous save first
  if (!notes.empty()) notes += "\n";
  const double t1 = now_s();
  ckpt::SaveRequest r = request();
  // Snapshot: host copies the training can no longer change.
  NoGradGuard ng;
  std::function<void()> before;
  if (side_) {
    stream_wait(*side_, tr_.stream());  // after this step's update
    StreamGuard g(*side_);
    for (dist::StatePiece& p : r.pieces) p.data = p.data.to(Device::cpu(), /*non_blocking=*/true);
    tr_.hold_updates_until(*side_);
    before = [s = *side_] { s.synchronize(); };
  } else {
    for (dist::StatePiece& p : r.pieces) p.data = p.data.clone();
  }
  ckpt::prepare(r, tr_.process_group());
  const int64_t step = r.step;
  writer_.start(std::move(r), tr_.rank(), std::move(before));
  started_ = t1;
  const std::string waited =
      t1 - t0 > 1e-3 ? fmt::format(" (after waiting {:.1f} ms for the previous save)", (t1 - t0) * 1e3) : "";
  return notes + fmt::format("step {}: checkpoint snapshot taken in {:.1f} ms{}; writing in the background",
                             step, (now_s() - t1) * 1e3, waited);
}

std::string Checkpointer::poll() { return finish(/*block=*/false); }

std::string Checkpointer::flush() { return finish(/*block=*/true); }

std::string Checkpointer::finish(bool block) {
  if (!writer_.pending()) return "";
  if (block) writer_.wait();
  if (!tr_.all_ranks(writer_.done())) return "";
  const std::string err = writer_.wait();
  const bool all_ok = tr_.all_ranks(err.empty());
  ckpt::SaveRequest r = writer_.take();
  const std::string failed = cat("checkpoint of step ", r.step, " abandoned", err.empty() ? "" : ": " + err,
                                 "; the previous checkpoint stays the latest");
  if (!all_ok) return err.empty() ? failed + " (another rank failed; see its log)" : failed;
  if (tr_.rank() != 0) return "";
  try {
    const std::string dir = ckpt::commit(r, tr_.world_size());
    return saved_line(dir, now_s() - started_, "asynchronous");
  } catch (const Error& e) {
    return cat("checkpoint of step ", r.step, " abandoned: ", e.what(),
               "; the previous checkpoint stays the latest");
  }
}

std::string resume_target(const std::string& resume, std::string* chosen) {
  try {
    return ckpt::resolve(resume, chosen);
  } catch (const Error& e) {
    BT_FAIL("train.resume: ", e.what(), "; or set train.resume=auto (with checkpoint.dir) or none");
  }
}

namespace {

/// The run will save the steps of `unusable` again: rank 0 moves them aside
/// (ckpt::set_aside), and every rank stops here if it cannot. Lines to print.
std::string set_aside(train::Trainer& tr, const std::vector<std::string>& unusable,
                      const std::string& chosen) {
  std::string notes, err;
  if (tr.rank() == 0) {
    try {
      for (const std::string& u : unusable)
        notes += cat("moved ", u, " aside to ", ckpt::set_aside(u, chosen), "\n");
    } catch (const Error& e) {
      err = e.what();
    }
  }
  if (!tr.all_ranks(err.empty()))
    BT_FAIL(err.empty() ? "rank 0 could not move an unusable checkpoint aside (see its log)" : err);
  return notes;
}

}  // namespace

std::string resume(train::Trainer& tr) {
  const train::TrainConfig& cfg = tr.config();
  const std::string& how = cfg.train.resume;
  if (how == "none") return "";
  if (how != "auto") {  // one named checkpoint (or a root's latest): no fallback
    std::string chosen, why;
    const std::string dir = resume_target(how, &chosen);
    if (!try_load(tr, dir, why)) BT_FAIL("cannot resume from checkpoint '", dir, "': ", why);
    return cat(chosen.empty() ? "" : chosen + "\n", "resumed from ", dir, " (", why, ")");
  }
  std::vector<std::string> all = ckpt::list(cfg.checkpoint.dir);
  if (all.empty()) return cat("no checkpoint in ", cfg.checkpoint.dir, " yet: starting from step 0");
  // Newest first, from the one `latest` names (the newest complete one).
  const std::string first = ckpt::latest(cfg.checkpoint.dir);
  std::string notes;
  std::vector<std::string> unusable;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (*it > first) continue;
    std::string why;
    if (try_load(tr, *it, why))
      return cat(notes, set_aside(tr, unusable, *it), "resumed from ", *it, " (", why, ")");
    notes += cat("checkpoint ", *it, " is unusable (", why, "); trying the one before\n");
    unusable.push_back(*it);
  }
  BT_FAIL(notes, "no usable checkpoint in ", cfg.checkpoint.dir,
          "; remove the damaged ones or set train.resume=none to start over");
}

}  // namespace bt::launcher
