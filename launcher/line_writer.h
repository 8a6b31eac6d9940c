// LineWriter: appends text to a FILE* from its own thread.
//
// Note [Log writes off the training thread]: a job's log and metrics file
// often sit on the filesystem its checkpoints go to. On ext4 a small write
// can wait for the journal commit that a checkpoint's fsync started, and a
// training thread writing its per-step line there stalled a whole step by
// 0.3-0.7 s at the end of each background save (bench/RESULTS.md). So the
// per-step lines are queued here and written, and flushed, by a thread of
// their own; the training thread only copies a string.
#pragma once

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

namespace bt::launcher {

class LineWriter {
 public:
  /// Writes to `f` (not owned; it must outlive this). `what` names it in
  /// errors ("" : write errors are ignored, as for a terminal).
  LineWriter(FILE* f, std::string what);
  /// Writes what is queued, then stops (errors are dropped here).
  ~LineWriter();
  LineWriter(const LineWriter&) = delete;
  LineWriter& operator=(const LineWriter&) = delete;

  /// Queues `text`. Throws bt::Error naming the file when an earlier write
  /// failed (a full disk, say).
  void write(std::string text);
  /// Blocks until everything queued is written and flushed; throws as write().
  void drain();

 private:
  void run();
  void check_error();
  FILE* f_;
  std::string what_;
  std::mutex mu_;
  std::condition_variable has_text_, idle_;
  std::deque<std::string> queue_;
  bool busy_ = false, stop_ = false;
  int error_ = 0;  // errno of the first failed write
  std::thread thread_;
};

}  // namespace bt::launcher
