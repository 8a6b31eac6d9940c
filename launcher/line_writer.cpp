#include "launcher/line_writer.h"

#include <cerrno>
#include <cstring>

#include "kernels/common/error.h"

namespace bt::launcher {

LineWriter::LineWriter(FILE* f, std::string what) : f_(f), what_(std::move(what)) {
  thread_ = std::thread([this] { run(); });
}

LineWriter::~LineWriter() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  has_text_.notify_one();
  thread_.join();
}

void LineWriter::check_error() {
  if (error_ != 0 && !what_.empty())
    BT_FAIL("cannot write ", what_, ": ", std::strerror(error_),
            error_ == ENOSPC ? " (the disk is full)" : "");
}

void LineWriter::write(std::string text) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    check_error();
    queue_.push_back(std::move(text));
  }
  has_text_.notify_one();
}

void LineWriter::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  idle_.wait(lk, [&] { return queue_.empty() && !busy_; });
  check_error();
}

void LineWriter::run() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    has_text_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, and everything written
    std::deque<std::string> batch;
    batch.swap(queue_);
    busy_ = true;
    lk.unlock();
    int err = 0;
    for (const std::string& t : batch)
      if (err == 0 && std::fputs(t.c_str(), f_) < 0) err = errno;
    if (err == 0 && std::fflush(f_) != 0) err = errno;
    lk.lock();
    if (err != 0 && error_ == 0) error_ = err;
    busy_ = false;
    if (queue_.empty()) idle_.notify_all();
  }
}

}  // namespace bt::launcher
