// AsyncWriter: writes one rank's part of a checkpoint on a background thread
// while training goes on (Note [Asynchronous checkpoints]).
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "checkpoint/checkpoint.h"

namespace bt::ckpt {

// Note [Asynchronous checkpoints]: a save is split so that no collective runs
// off the training thread.
//   1. training thread, at the save's step: the state pieces are copied to
//      pinned host memory (CUDA: on a side stream, which the next optimizer
//      update waits for -- the snapshot blocks the host only to enqueue the
//      copies); prepare() creates step_X.tmp/; start() hands the snapshot to
//      the writer thread, which waits for the copies and runs write_rank().
//   2. training thread, after every later step: when this rank's writer is
//      done, the ranks agree (a one-scalar all-reduce) that all are; then
//      rank 0 commits (index, rename, `latest`; milliseconds).
//   3. a save that finds the previous one pending waits for it first; the
//      end of training flushes the last one. A rank whose writer failed makes
//      every rank abandon the save: its .tmp directory never becomes a
//      checkpoint and the next save removes it.
class AsyncWriter {
 public:
  AsyncWriter() = default;
  ~AsyncWriter();
  AsyncWriter(const AsyncWriter&) = delete;
  AsyncWriter& operator=(const AsyncWriter&) = delete;

  /// Runs `before` (e.g. waiting for the snapshot copies), then
  /// write_rank(r, rank), on the writer thread. One save at a time.
  void start(SaveRequest r, int rank, std::function<void()> before = {});
  bool pending() const { return pending_; }
  /// Non-blocking: whether this rank's part of the pending save is written
  /// (or has failed).
  bool done();
  /// Blocks until it is; returns the writer's error message ("" when ok).
  std::string wait();
  /// The request of the pending save (commit() needs it); clears it.
  SaveRequest take();

 private:
  std::thread thread_;
  std::mutex mu_;
  bool pending_ = false, finished_ = false;
  std::string error_;
  SaveRequest req_;
};

}  // namespace bt::ckpt
