// IoPool: a few threads that run the block reads and writes of a checkpoint
// file (pread/pwrite and their crc32s) so that the disk sees several requests
// at once while the calling thread prepares the next blocks. Jobs never call
// HDF5 (the library is not thread-safe here) nor CUDA.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace bt::ckpt {

class IoPool {
 public:
  /// `threads` workers; submit() blocks while `max_queued` jobs wait, which
  /// bounds the memory that queued jobs hold (their staging buffers).
  /// `background`: the workers run at a lower CPU priority (nice 10), so a
  /// checkpoint written during training yields the cores to it.
  explicit IoPool(int threads, int max_queued = 16, bool background = false);
  /// Waits for the jobs; an error not collected by wait() is dropped.
  ~IoPool();
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  /// Queues `job`. After a job has thrown, later ones are skipped (not run).
  void submit(std::function<void()> job);
  /// Blocks until every submitted job has run or been skipped; rethrows the
  /// first job's exception, if any (and clears it).
  void wait();

  /// Threads for checkpoint I/O: 8, or fewer on a machine with fewer CPUs.
  static int default_threads();
  /// Lowers the calling thread's CPU priority to nice 10 (Linux; a hint).
  static void lower_priority();

 private:
  void work(bool background);
  std::mutex mu_;
  std::condition_variable has_job_, has_room_, idle_;
  std::deque<std::function<void()>> jobs_;
  std::exception_ptr error_;
  int running_ = 0;
  size_t max_queued_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace bt::ckpt
