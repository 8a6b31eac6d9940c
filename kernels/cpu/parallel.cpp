// The CPU kernels' thread pool; the policy is at the top of parallel.h.
#include "kernels/cpu/parallel.h"

#if defined(__linux__)
#include <sched.h>
#endif

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/common/env.h"
#include "kernels/common/error.h"

namespace bt::kernels::cpu {
namespace {

thread_local bool t_in_parallel = false;

/// Sets t_in_parallel for the lifetime of the guard, restoring it after.
struct RegionGuard {
  bool saved = t_in_parallel;
  RegionGuard() { t_in_parallel = true; }
  ~RegionGuard() { t_in_parallel = saved; }
};

/// CPUs this process may run on: its affinity mask (taskset, cgroup cpusets,
/// Slurm), else std::thread::hardware_concurrency().
int usable_cpus() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(std::min(hw, 1024u));
}

int default_num_threads() {
  return static_cast<int>(
      env_int("BT_NUM_THREADS", usable_cpus(), 1, 1024, "the CPU threads; unset it to use every core"));
}

/// One parallel loop in flight. Lives on the stack of the thread that called
/// run_chunks, which does not return before every worker has left it.
struct Job {
  void (*call)(void*, int64_t);
  void* ctx;
  int64_t nchunks;
  std::atomic<int64_t> next{0};     // next chunk to claim
  std::atomic<bool> failed{false};  // stop claiming once a chunk threw
  int workers_in = 0;               // workers inside work(); guarded by Pool::mu_
  std::mutex err_mu;                // guards err and err_chunk
  std::exception_ptr err;           // the exception of the lowest chunk that threw
  int64_t err_chunk = std::numeric_limits<int64_t>::max();

  void work() {
    for (;;) {
      const int64_t c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= nchunks || failed.load(std::memory_order_relaxed)) return;
      try {
        call(ctx, c);
      } catch (...) {
        std::lock_guard<std::mutex> lk(err_mu);
        if (c < err_chunk) err = std::current_exception(), err_chunk = c;
        failed.store(true, std::memory_order_relaxed);
      }
    }
  }
};

class Pool {
 public:
  int size() {
    std::lock_guard<std::mutex> lk(mu_);
    if (size_ == 0) size_ = default_num_threads();
    return size_;
  }

  void resize(int n) {
    BT_CHECK(!t_in_parallel, "set_num_threads: called from inside a parallel loop");
    std::lock_guard<std::mutex> submit(submit_mu_);  // waits for a loop in flight
    stop_workers();
    std::lock_guard<std::mutex> lk(mu_);
    size_ = n >= 1 ? n : default_num_threads();
  }

  void run(Job& job) {
    std::lock_guard<std::mutex> submit(submit_mu_);
    start_workers();
    {
      std::lock_guard<std::mutex> lk(mu_);
      job_ = &job;
      ++generation_;
    }
    cv_work_.notify_all();
    {
      RegionGuard region;
      job.work();
    }
    // Every chunk is claimed now; wait for the workers still running theirs,
    // then retire the job under the lock so no late worker can enter it.
    std::unique_lock<std::mutex> lk(mu_);
    cv_done_.wait(lk, [&] { return job.workers_in == 0; });
    job_ = nullptr;
  }

 private:
  void start_workers() {  // called with submit_mu_ held
    const int want = size() - 1;
    if (static_cast<int>(workers_.size()) == want) return;
    stop_workers();
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lk(mu_);
      gen = generation_;
    }
    workers_.reserve(static_cast<size_t>(want));
    for (int i = 0; i < want; ++i) workers_.emplace_back([this, gen] { worker_loop(gen); });
  }

  void stop_workers() {  // called with submit_mu_ held
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_work_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = false;
  }

  void worker_loop(uint64_t seen) {  // seen: the last generation this worker need not run
    t_in_parallel = true;            // a nested loop on a worker runs inline
    for (;;) {
      Job* job = nullptr;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_work_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
        if (job == nullptr) continue;  // woke after that loop was retired
        ++job->workers_in;
      }
      job->work();
      bool last;
      {
        std::lock_guard<std::mutex> lk(mu_);
        last = --job->workers_in == 0;
      }
      if (last) cv_done_.notify_one();
    }
  }

  std::mutex submit_mu_;  // one loop at a time; held across run() and resize()
  std::mutex mu_;         // guards everything below
  std::condition_variable cv_work_, cv_done_;
  std::vector<std::thread> workers_;
  Job* job_ = nullptr;
  uint64_t generation_ = 0;
  bool stop_ = false;
  int size_ = 0;  // 0: not read from the environment yet
};

// Never destroyed: kernels may run from other static destructors, and the
// idle workers block on a condition variable, which is harmless at exit.
Pool& pool() {
  static Pool* p = new Pool();
  return *p;
}

}  // namespace

int num_threads() { return pool().size(); }

void set_num_threads(int n) { pool().resize(n); }

bool in_parallel_region() { return t_in_parallel; }

namespace detail {

void run_chunks(int64_t nchunks, void (*call)(void*, int64_t), void* ctx) {
  if (nchunks <= 0) return;
  if (t_in_parallel || nchunks == 1 || pool().size() == 1) {
    RegionGuard region;  // nested loops inside these chunks also run inline
    for (int64_t c = 0; c < nchunks; ++c) call(ctx, c);
    return;
  }
  Job job;
  job.call = call;
  job.ctx = ctx;
  job.nchunks = nchunks;
  pool().run(job);
  if (job.err) std::rethrow_exception(job.err);
}

}  // namespace detail
}  // namespace bt::kernels::cpu
