#include "checkpoint/async_writer.h"

#include "checkpoint/io_pool.h"

namespace bt::ckpt {

AsyncWriter::~AsyncWriter() {
  if (thread_.joinable()) thread_.join();
}

void AsyncWriter::start(SaveRequest r, int rank, std::function<void()> before) {
  BT_CHECK(!pending_, "AsyncWriter::start: the previous save is still pending");
  if (thread_.joinable()) thread_.join();
  req_ = std::move(r);
  req_.background = true;
  pending_ = true;
  finished_ = false;
  error_.clear();
  thread_ = std::thread([this, rank, before = std::move(before)] {
    std::string err;
    IoPool::lower_priority();
    try {
      if (before) before();
      write_rank(req_, rank);
    } catch (const std::exception& e) {
      err = e.what();
    }
    std::lock_guard<std::mutex> lk(mu_);
    error_ = err;
    finished_ = true;
  });
}

bool AsyncWriter::done() {
  std::lock_guard<std::mutex> lk(mu_);
  return finished_;
}

std::string AsyncWriter::wait() {
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lk(mu_);
  return error_;
}

SaveRequest AsyncWriter::take() {
  wait();
  pending_ = false;
  return std::move(req_);
}

}  // namespace bt::ckpt
