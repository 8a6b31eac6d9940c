// Sharded checkpoints of a training job (docs/checkpoint-format.md):
// ROOT/step_XXXXXXXX/ holds one HDF5 file per rank (shard_file.h), each
// rank's fragment rank_RRRRR.json, and index.json (index.h), written last.
//
// Note [Checkpoint commit]: a save is collective.
//   1. rank 0 removes stale ROOT/*.tmp directories (saves that died) and
//      creates ROOT/step_X.tmp/; barrier
//   2. every rank writes and fsyncs rank_R.h5, then rank_R.json; barrier
//   3. rank 0 merges the fragments into index.json (written to a temporary
//      name, fsynced, renamed), fsyncs the directory, renames step_X.tmp to
//      step_X, fsyncs ROOT, and replaces ROOT/latest (temporary file + fsync
//      + rename) with "step_X"; then applies retention; barrier
// A crash anywhere before the directory rename leaves only a .tmp directory,
// which every reader ignores; a crash after it leaves a complete checkpoint,
// which latest() finds by scanning even if `latest` still names the older
// one. A directory without index.json is never a checkpoint.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/index.h"
#include "runtime/dist/process_group.h"
#include "runtime/dist/strategy.h"

namespace bt::ckpt {

struct SaveRequest {
  std::string root;  // checkpoint.dir
  int64_t step = 0;
  std::vector<dist::StatePiece> pieces;          // this rank's share (Strategy::state_pieces(true))
  std::map<std::string, int64_t> counters;       // job-wide scalars (rank 0's are kept)
  std::map<std::string, int64_t> rank_counters;  // this rank's own (its RNG state)
  nlohmann::json config;                         // the resolved config
  std::string strategy = "local";
  std::string device;       // this rank's device
  int64_t keep_last = 0;    // retention: keep the newest K (0: keep all) ...
  int64_t keep_every = 0;   // ... and every checkpoint whose step is a multiple of M (0: none)
  bool background = false;  // written while training goes on: the I/O threads yield the CPU
};

/// Saves by Note [Checkpoint commit]; collective over `pg` (null: one
/// process). Returns the checkpoint directory. Throws bt::Error naming the
/// path on failure (the previous checkpoints and `latest` stay as they were).
std::string save(const SaveRequest& r, dist::ProcessGroup* pg);

// The phases of save(), for savers that order them themselves (the
// asynchronous writer, async_writer.h).
/// Step 1, collective: rank 0 removes stale .tmp directories (this step's
/// too: a save that died half-way, before a restart) and an index-less
/// leftover of this step, and creates ROOT/step_X.tmp/; then, after a
/// barrier, the other ranks see it. Returns it.
std::string prepare(const SaveRequest& r, dist::ProcessGroup* pg);
/// Step 2: this rank's HDF5 file and fragment, fsynced. Does not communicate.
void write_rank(const SaveRequest& r, int rank);
/// Step 3, rank 0, once every rank's step 2 is done: index, rename, `latest`,
/// retention. Returns the checkpoint directory.
std::string commit(const SaveRequest& r, int world);

/// "step_00000020" for step 20.
std::string dir_name(int64_t step);
/// Complete checkpoints under `root` (directories step_X with an index.json),
/// oldest first. Empty when `root` does not exist.
std::vector<std::string> list(const std::string& root);
/// The checkpoint to resume from: the one `root/latest` names when it is
/// complete, else the newest complete one; "" when there is none.
std::string latest(const std::string& root);

/// A checkpoint a user named: `path` itself when it is one (it has an
/// index.json), else, when `path` is a checkpoint root, its latest(); sets
/// `chosen` to a line saying which one was taken in that case ("" when `path`
/// is a checkpoint). Throws bt::Error naming `path` when it is neither.
std::string resolve(const std::string& path, std::string* chosen = nullptr);

/// Moves checkpoint `dir`, which resume found unusable, out of the way of the
/// saves to come (the run will reach its step again): renamed to
/// DIR.unusable (DIR.unusable.2, ... when taken), kept for inspection and
/// ignored by list(), latest() and retention. When its root's `latest` names
/// it, `latest` then names `fallback`, the checkpoint the run resumed from.
/// Returns the new path. Rank 0 only.
std::string set_aside(const std::string& dir, const std::string& fallback);

/// What is wrong with ROOT/latest: "" when it is absent (no save committed
/// yet, or an older layout) or names a complete checkpoint; otherwise why it
/// does not (resume then falls back to the newest complete one).
std::string latest_pointer_problem(const std::string& root);

/// The bytes of the files in a checkpoint directory.
uint64_t bytes_on_disk(const std::string& dir);

/// Reads DIR/index.json. Throws bt::Error naming DIR when it is missing or bad.
Index read_index(const std::string& dir);

/// A checkpoint that cannot serve this job: a tensor of another shape, or
/// one the checkpoint lacks (another model). Not a reason to fall back to an
/// older checkpoint.
class Incompatible : public Error {
 public:
  using Error::Error;
};

/// Fills every piece from the checkpoint, whatever world size and strategy
/// saved it (Note [State pieces]): each piece reads the saved ranges that
/// overlap it. Throws Incompatible for a shape or name mismatch, bt::Error for
/// corruption or unreadable files.
void load_pieces(const std::string& dir, const Index& idx, const std::vector<dist::StatePiece>& pieces);

/// Everything wrong with a checkpoint: an incomplete index, a missing file,
/// a piece whose data does not match its checksums. Empty: it is sound.
std::vector<std::string> verify(const std::string& dir);

}  // namespace bt::ckpt
