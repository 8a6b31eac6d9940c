// CachingPool: the device-independent caching allocator behind cuda_allocator().
//
// ============================================================================ POLICY
// Modelled on PyTorch's CUDACachingAllocator. cudaMalloc/cudaFree are slow and
// synchronize the device, so memory is taken from the device in large
// *segments* and handed out as *blocks* carved from them; freed blocks stay
// cached in the pool and are reused without asking the device again.
//
//  Sizes.  Every request is rounded up to a multiple of 512 B (0 B -> 512 B).
//
//  Two pools.  Requests of <= 1 MiB (rounded) use the *small* pool, larger ones
//  the *large* pool; a block never moves between pools, so small tensors do
//  not fragment the segments that large ones need.
//    - small pool segments are 2 MiB;
//    - large requests of < 10 MiB get a 20 MiB segment (several of them share
//      one segment);
//    - large requests of >= 10 MiB get a segment of the request rounded up to
//      2 MiB, which keeps the tail that cannot be split off small.
//
//  Best fit.  The free blocks of each pool are kept in a std::set ordered by
//  (stream, size, address). A request takes the smallest free block of its
//  pool *and of its stream* that is large enough (lowest address on ties).
//  Only when none fits is a new segment taken from the backing allocator.
//
//  Splitting.  A block larger than the request is split, and the rest goes
//  back to the pool as a free block, when the rest is >= 512 B (small pool) or
//  > 1 MiB (large pool). Otherwise the caller gets the whole block (so a large
//  block may be up to 1 MiB bigger than asked for; `allocated` counts it).
//
//  Coalescing.  A freed block merges with its free neighbours in the same
//  segment, so a segment whose blocks are all free is one free block again.
//
//  Streams.  Memory is stream-ordered: a block belongs to the stream it was
//  allocated on (a segment and all of its blocks to the stream that made the
//  segment), and only requests on that same stream reuse it. A block freed on
//  its own stream is reusable by that stream at once: any later work on that
//  stream runs after the work that used the block. If record_stream() said
//  that other streams used the block too, deallocate() records an event on
//  each of them and the block returns to the pool only when all those events
//  have completed. Completed events are looked for lazily, at the start of
//  every allocate() (and by empty_cache() and the out-of-memory path).
//
//  Out of memory.  When the backing allocator fails:
//    1. synchronize() the device, which completes every pending event, and
//       return the blocks waiting on them to the pool; if a free block now
//       fits, use it (no flush is counted);
//    2. otherwise release every cached segment that is entirely free (of any
//       stream and either pool; the device is idle after step 1) and retry
//       the backing allocation once (stats.num_oom_retries counts these);
//    3. if that fails and the segment size was larger than the request (a
//       20 MiB segment for a 1..10 MiB request), try a segment of just the
//       request rounded up to 2 MiB;
//    4. if that fails too, throw bt::Error naming the requested size, the
//       bytes allocated and reserved, the device's capacity when the backing
//       knows it, and what to do about it.
//
//  empty_cache() returns every entirely-free segment to the backing allocator.
//  Segments with a live or pending block stay. The device is synchronized
//  before any segment is released (its last users may still be running) and
//  before pending events are collected, so blocks waiting on them count too.
//
//  Statistics: see AllocatorStats in runtime/alloc/allocator.h. `allocated`
//  drops at deallocate() even when the block still waits for events.
//
//  Threads.  Every public method takes one mutex; the backing allocator is
//  only ever called with that mutex held, so it needs no locking of its own.
//
//  Errors.  deallocate() or record_stream() of a pointer that is not a live
//  block of this pool is a BluTrain bug: BT_ASSERT (bt::InternalError).
//  deallocate(nullptr) does nothing.
// ============================================================================
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/alloc/allocator.h"

namespace bt {

/// What the pool needs from a device. Called only with the pool's mutex held.
class BackingAllocator {
 public:
  virtual ~BackingAllocator() = default;
  virtual void* raw_alloc(size_t bytes) = 0;  // nullptr on out-of-memory
  virtual void raw_free(void* p) = 0;
  virtual uint64_t record_event(uintptr_t stream) = 0;  // an event marking work queued so far on stream
  virtual bool event_done(uint64_t ev) = 0;
  virtual void release_event(uint64_t ev) = 0;
  virtual void synchronize() = 0;  // wait for all device work (used before flushing on OOM)

  /// Names the device in messages, e.g. "cuda:0".
  virtual std::string name() const { return "device"; }
  /// Free and total bytes of the device, when known (for the OOM message).
  virtual bool memory_info(size_t* free_bytes, size_t* total_bytes) { return false; }
};

class CachingPool {
 public:
  static constexpr size_t kMinBlockSize = 512;                // rounding unit
  static constexpr size_t kSmallSize = size_t{1} << 20;       // largest small-pool request
  static constexpr size_t kSmallBuffer = size_t{2} << 20;     // small-pool segment size
  static constexpr size_t kLargeBuffer = size_t{20} << 20;    // segment for 1..10 MiB requests
  static constexpr size_t kMinLargeAlloc = size_t{10} << 20;  // from here: request rounded to 2 MiB
  static constexpr size_t kRoundLarge = size_t{2} << 20;

  /// The pool does not own `backing`, which must outlive it.
  explicit CachingPool(BackingAllocator& backing);
  /// Returns every segment to the backing allocator. Memory still live in it
  /// becomes invalid.
  ~CachingPool();
  CachingPool(const CachingPool&) = delete;
  CachingPool& operator=(const CachingPool&) = delete;

  /// A block of at least round_size(nbytes) bytes, reusable in order on `stream`.
  void* allocate(size_t nbytes, uintptr_t stream);
  void deallocate(void* p);
  /// deallocate(p) when `p` is a live block of this pool (true); otherwise
  /// nothing (false). For callers that mix the pool with other memory.
  bool deallocate_if_owned(void* p);
  /// Declares that the live block `p` is also used by work on `stream`.
  void record_stream(void* p, uintptr_t stream);
  /// Returns every entirely-free segment to the backing allocator.
  void empty_cache();

  AllocatorStats stats() const;
  void reset_peak();

  /// The request size after rounding (512 B multiples, at least 512 B).
  static size_t round_size(size_t nbytes);
  /// The segment size taken from the backing allocator for a rounded request.
  static size_t segment_size(size_t rounded);

  // ------------------------------------------------------------ introspection
  enum class BlockState : uint8_t { kFree, kLive, kPending };
  struct BlockInfo {
    uintptr_t addr;
    size_t size;
    BlockState state;
  };
  struct SegmentInfo {
    uintptr_t addr;
    size_t size;
    uintptr_t stream;
    bool small;
    std::vector<BlockInfo> blocks;  // in address order, tiling the segment
  };
  /// Every segment with its blocks, in address order (tests, debugging).
  std::vector<SegmentInfo> snapshot() const;
  /// Size of the live block `p` (>= round_size of its request).
  size_t block_size(const void* p) const;

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    uintptr_t stream = 0;
    bool small = false;
    BlockState state = BlockState::kFree;
    Block* prev = nullptr;  // neighbours in the same segment, by address
    Block* next = nullptr;
    int pending_events = 0;              // while kPending
    std::vector<uintptr_t> stream_uses;  // other streams (record_stream), while kLive
  };
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const;
  };
  using FreeSet = std::set<Block*, BlockLess>;

  FreeSet& free_set(bool small) { return small ? small_free_ : large_free_; }
  Block* find_free(size_t size, bool small, uintptr_t stream);
  Block* new_segment(size_t size, bool small, uintptr_t stream, size_t nbytes);
  void* take(Block* b, size_t size);
  void free_block(Block* b);
  void process_events();
  void synchronize_and_process_events();
  void release_segment(Block* head);
  size_t release_free_segments(bool synchronized);
  [[noreturn]] void throw_oom(size_t nbytes, size_t seg);

  BackingAllocator& backing_;
  mutable std::mutex mu_;
  FreeSet small_free_;
  FreeSet large_free_;
  std::unordered_map<void*, Block*> live_;            // kLive blocks by address
  std::map<char*, Block*> segments_;                  // segment base -> head block
  std::vector<std::pair<uint64_t, Block*>> pending_;  // (event, block waiting on it)
  AllocatorStats stats_;
};

namespace alloc_detail {
/// "1.50 GiB (1610612736 bytes)"-style text for messages.
std::string format_bytes(size_t n);
}  // namespace alloc_detail

}  // namespace bt
