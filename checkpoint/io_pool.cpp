#include "checkpoint/io_pool.h"

#include <algorithm>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace bt::ckpt {

IoPool::IoPool(int threads, int max_queued, bool background)
    : max_queued_(static_cast<size_t>(std::max(1, max_queued))) {
  for (int i = 0; i < std::max(1, threads); ++i)
    threads_.emplace_back([this, background] { work(background); });
}

void IoPool::lower_priority() {
#ifdef __linux__
  // On Linux the nice value is per thread: PRIO_PROCESS with a thread id.
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);
#endif
}

IoPool::~IoPool() {
  {
    std::unique_lock<std::mutex> lk(mu_);
    idle_.wait(lk, [&] { return jobs_.empty() && running_ == 0; });
    stop_ = true;
  }
  has_job_.notify_all();
  for (std::thread& t : threads_) t.join();
}

int IoPool::default_threads() {
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
}

void IoPool::submit(std::function<void()> job) {
  {
    std::unique_lock<std::mutex> lk(mu_);
    has_room_.wait(lk, [&] { return jobs_.size() < max_queued_; });
    jobs_.push_back(std::move(job));
  }
  has_job_.notify_one();
}

void IoPool::wait() {
  std::unique_lock<std::mutex> lk(mu_);
  idle_.wait(lk, [&] { return jobs_.empty() && running_ == 0; });
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void IoPool::work(bool background) {
  if (background) lower_priority();
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    has_job_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stop_
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    const bool skip = error_ != nullptr;
    ++running_;
    has_room_.notify_one();
    lk.unlock();
    std::exception_ptr err;
    if (!skip) {
      try {
        job();
      } catch (...) {
        err = std::current_exception();
      }
    }
    job = nullptr;  // its buffers go before the pool reports idle
    lk.lock();
    if (err && !error_) error_ = err;
    --running_;
    if (jobs_.empty() && running_ == 0) idle_.notify_all();
  }
}

}  // namespace bt::ckpt
