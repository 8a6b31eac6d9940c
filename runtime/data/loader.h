// TokenLoader: B x T batches of (inputs, targets) from llm.c token shards,
// prepared by a background thread into pinned host tensors.
//
// Samples are non-overlapping windows of T+1 tokens starting at multiples of T
// in each shard (windows that do not fit are dropped); inputs are the first T
// tokens, targets the last T. Each epoch orders all (shard, window) samples,
// shuffled by std::mt19937_64(seed + epoch) when shuffle is on. Global batch g
// of an epoch is samples [g*B*world, (g+1)*B*world) of that order, and rank r
// takes the r-th block of B of them, so ranks see disjoint samples whose union
// is what one process with batch B*world would see. An epoch ends when fewer
// than B*world samples remain (the tail is dropped). Shards that fit in a
// quarter of the memory are read into the page cache in the background when
// the loader opens them (Note [Token shards in the page cache]).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/data/shard.h"
#include "runtime/tensor/tensor.h"

namespace bt {

/// One batch: i32 CPU tensors of shape [B, T] in pinned memory.
struct Batch {
  Tensor inputs, targets;
};

/// Where a TokenLoader is: `position` is the index, within `epoch`, of the
/// next global batch next() returns. Saved with checkpoints to resume exactly.
struct LoaderState {
  int64_t epoch = 0;
  int64_t position = 0;
  uint64_t seed = 0;
};

/// Serves batches from the shards matching a glob; see the top of this file.
class TokenLoader {
 public:
  /// Opens and validates every shard matching `glob`. Throws bt::Error for
  /// B or T <= 0, rank outside [0, world), or too few tokens for one global batch.
  TokenLoader(const std::string& glob, int64_t B, int64_t T, int rank = 0, int world = 1, uint64_t seed = 0,
              bool shuffle = true);
  ~TokenLoader();
  TokenLoader(const TokenLoader&) = delete;
  TokenLoader& operator=(const TokenLoader&) = delete;

  /// The next batch (waits for the prefetch thread; rethrows its errors).
  Batch next();
  /// The state of the batch the next call to next() returns.
  LoaderState state() const;
  /// Continues from `s` (as returned by state()); prefetched batches are dropped.
  void restore(const LoaderState& s);

  /// Global batches per epoch: samples / (B * world), rounded down.
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  /// Samples (windows of T+1 tokens) per epoch, before dropping the tail.
  int64_t num_samples() const { return num_samples_; }
  const std::vector<ShardInfo>& shards() const { return shards_; }

 private:
  struct Item {
    Batch batch;
    LoaderState state;
    std::exception_ptr error;
  };

  /// Asks the kernel to read the shards (`bytes` in all) into the page cache
  /// when they fit (Note [Token shards in the page cache]).
  void prefetch_into_page_cache(int64_t bytes) const;
  void start_worker(const LoaderState& s);
  void stop_worker();
  void worker_loop(LoaderState s);
  Batch make_batch(const LoaderState& s, std::vector<uint64_t>& order, int64_t& order_epoch,
                   std::vector<uint16_t>& buf) const;
  void fill_order(int64_t epoch, uint64_t seed, std::vector<uint64_t>& order) const;
  LoaderState advance(LoaderState s) const;

  int64_t B_, T_;
  int rank_, world_;
  bool shuffle_;
  std::vector<ShardInfo> shards_;
  std::vector<int> fds_;
  std::vector<int64_t> first_sample_;  // prefix sums of windows per shard (size shards + 1)
  int64_t num_samples_ = 0;
  int64_t batches_per_epoch_ = 0;

  LoaderState next_state_;  // consumer side: state of the batch next() returns

  static constexpr size_t kDepth = 2;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace bt
