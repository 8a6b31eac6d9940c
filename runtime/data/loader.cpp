#include "runtime/data/loader.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include <fcntl.h>
#include <unistd.h>

#include "kernels/common/error.h"
#include "runtime/tensor/factory.h"

namespace bt {

TokenLoader::TokenLoader(const std::string& glob, int64_t B, int64_t T, int rank, int world, uint64_t seed,
                         bool shuffle)
    : B_(B), T_(T), rank_(rank), world_(world), shuffle_(shuffle) {
  BT_CHECK(B > 0 && T > 0, "TokenLoader: batch size B and sequence length T must be positive, got B=", B,
           " T=", T);
  BT_CHECK(world > 0 && rank >= 0 && rank < world, "TokenLoader: rank ", rank,
           " is outside [0, world=", world, ")");
  int64_t total_tokens = 0;
  first_sample_.push_back(0);
  for (const std::string& path : expand_glob(glob)) {
    shards_.push_back(read_shard_header(path));
    const int64_t n = shards_.back().num_tokens;
    total_tokens += n;
    first_sample_.push_back(first_sample_.back() + (n > 0 ? (n - 1) / T : 0));
  }
  num_samples_ = first_sample_.back();
  batches_per_epoch_ = num_samples_ / (B * world);
  BT_CHECK(batches_per_epoch_ > 0, "TokenLoader: the ", shards_.size(), " shard(s) matching '", glob,
           "' hold ", total_tokens, " tokens in ", num_samples_, " window(s) of T+1=", T + 1,
           " tokens, but one global batch needs B*world*(T+1) = ", B, "*", world, "*", T + 1, " = ",
           B * world * (T + 1), " tokens in ", B * world,
           " windows; use more data or a smaller batch/sequence length");
  for (const ShardInfo& s : shards_) {
    const int fd = ::open(s.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const std::string why = std::strerror(errno);
      for (int f : fds_) ::close(f);
      BT_FAIL("TokenLoader: cannot open token shard '", s.path, "': ", why);
    }
    fds_.push_back(fd);
  }
  prefetch_into_page_cache(total_tokens * 2);
  next_state_ = LoaderState{0, 0, seed};
  start_worker(next_state_);
}

void TokenLoader::prefetch_into_page_cache(int64_t bytes) const {
  // Note [Token shards in the page cache]: samples are small windows read at
  // random offsets. Read from the disk while a checkpoint streams its writes
  // to it, each of those reads waits behind the writes, and training steps
  // slowed from 1.20 s to 1.70 s (bench/RESULTS.md, page cache dropped). So
  // when the shards fit comfortably in memory (at most a quarter of it), the
  // kernel is asked to read them in now, in the background; later reads hit
  // the page cache. Larger datasets are left to the kernel's readahead.
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0 || bytes > static_cast<int64_t>(pages) * page / 4) return;
  for (int fd : fds_) (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
}

TokenLoader::~TokenLoader() {
  stop_worker();
  for (int fd : fds_) ::close(fd);
}

LoaderState TokenLoader::advance(LoaderState s) const {
  if (++s.position == batches_per_epoch_) {
    s.position = 0;
    ++s.epoch;
  }
  return s;
}

void TokenLoader::fill_order(int64_t epoch, uint64_t seed, std::vector<uint64_t>& order) const {
  order.resize(static_cast<size_t>(num_samples_));
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (!shuffle_) return;
  // Fisher-Yates with an explicit draw (std::shuffle's algorithm is library-defined).
  std::mt19937_64 rng(seed + static_cast<uint64_t>(epoch));
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
}

Batch TokenLoader::make_batch(const LoaderState& s, std::vector<uint64_t>& order, int64_t& order_epoch,
                              std::vector<uint16_t>& buf) const {
  if (order_epoch != s.epoch) {
    fill_order(s.epoch, s.seed, order);
    order_epoch = s.epoch;
  }
  TensorOptions opts{DType::I32, Device::cpu(), false, true};
  Batch b{empty({B_, T_}, opts), empty({B_, T_}, opts)};
  int32_t* in = b.inputs.data<int32_t>();
  int32_t* tg = b.targets.data<int32_t>();
  buf.resize(static_cast<size_t>(T_ + 1));
  const size_t nbytes = buf.size() * sizeof(uint16_t);
  const int64_t base = s.position * B_ * world_ + int64_t{rank_} * B_;
  for (int64_t i = 0; i < B_; ++i) {
    const auto sample = static_cast<int64_t>(order[static_cast<size_t>(base + i)]);
    const auto shard = static_cast<size_t>(
        std::upper_bound(first_sample_.begin(), first_sample_.end(), sample) - first_sample_.begin() - 1);
    const int64_t window = sample - first_sample_[shard];
    const off_t off = static_cast<off_t>(kShardHeaderBytes + window * T_ * 2);
    size_t got = 0;
    while (got < nbytes) {
      const ssize_t r = ::pread(fds_[shard], reinterpret_cast<char*>(buf.data()) + got, nbytes - got,
                                off + static_cast<off_t>(got));
      if (r < 0 && errno == EINTR) continue;
      BT_CHECK(r >= 0, "TokenLoader: reading token shard '", shards_[shard].path,
               "' failed: ", std::strerror(errno));
      BT_CHECK(r > 0, "TokenLoader: token shard '", shards_[shard].path, "' ended at byte ", off + got,
               " while reading window ", window, "; it was truncated after the loader opened it");
      got += static_cast<size_t>(r);
    }
    for (int64_t t = 0; t < T_; ++t) {
      in[i * T_ + t] = buf[static_cast<size_t>(t)];
      tg[i * T_ + t] = buf[static_cast<size_t>(t + 1)];
    }
  }
  return b;
}

void TokenLoader::worker_loop(LoaderState s) {
  std::vector<uint64_t> order;
  int64_t order_epoch = -1;
  std::vector<uint16_t> buf;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || queue_.size() < kDepth; });
      if (stop_) return;
    }
    Item item{{}, s, nullptr};
    try {
      item.batch = make_batch(s, order, order_epoch, buf);
    } catch (...) {
      item.error = std::current_exception();
    }
    const bool failed = item.error != nullptr;
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(std::move(item));
    }
    cv_.notify_all();
    if (failed) return;  // the error stays at the queue's front; next() rethrows it
    s = advance(s);
  }
}

void TokenLoader::start_worker(const LoaderState& s) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = false;
    queue_.clear();
  }
  worker_ = std::thread([this, s] { worker_loop(s); });
}

void TokenLoader::stop_worker() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::lock_guard<std::mutex> lk(mu_);
  queue_.clear();
}

Batch TokenLoader::next() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return !queue_.empty(); });
  if (queue_.front().error) std::rethrow_exception(queue_.front().error);
  Item item = std::move(queue_.front());
  queue_.pop_front();
  BT_ASSERT(item.state.epoch == next_state_.epoch && item.state.position == next_state_.position);
  next_state_ = advance(item.state);
  lk.unlock();
  cv_.notify_all();
  return std::move(item.batch);
}

LoaderState TokenLoader::state() const {
  std::lock_guard<std::mutex> lk(mu_);
  return next_state_;
}

void TokenLoader::restore(const LoaderState& s) {
  BT_CHECK(s.epoch >= 0 && s.position >= 0 && s.position < batches_per_epoch_,
           "TokenLoader::restore: state (epoch ", s.epoch, ", position ", s.position,
           ") is invalid for this data, which has ", batches_per_epoch_,
           " batches per epoch; was it saved with different shards, B, T or world size?");
  stop_worker();
  {
    std::lock_guard<std::mutex> lk(mu_);
    next_state_ = s;
  }
  start_worker(s);
}

}  // namespace bt
