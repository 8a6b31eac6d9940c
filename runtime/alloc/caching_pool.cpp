// The caching pool. The policy is described at the top of caching_pool.h.
//
// Data structures
//   - Each segment (one raw_alloc) is a doubly linked list of Blocks in address
//     order that tile it exactly; segments_ maps a segment's base to its head.
//   - A Block is in exactly one of: a free set (kFree), live_ (kLive), or
//     pending_ once per outstanding event (kPending).
//
// Note [Segment heads are stable]
//   Splitting keeps the front part in the existing Block and makes a new Block
//   for the rest; merging always deletes the higher-addressed of the two
//   blocks. So the head Block of a segment (prev == nullptr) lives exactly as
//   long as the segment, and segments_ can point at it.
//
// Note [No two free neighbours]
//   free_block() merges a block with free neighbours before inserting it into
//   a free set, so two adjacent blocks are never both kFree. Consequently the
//   remainder split off a free block in take() never has a free neighbour
//   either (its next was the original block's next), and a segment is entirely
//   free exactly when its head is kFree and has no next.
//
// Note [Free-set keys are immutable]
//   The free sets are ordered by (stream, size, address). A block's size or
//   address must never change while it is in a set: erase it first, change it,
//   then insert it again.
//
// Note [Synchronize before releasing segments]
//   A free block is only free *in its stream's order*: work queued on that
//   stream before the deallocate() may still be running on it. Reusing it on
//   the same stream is safe, but handing the memory back to the backing is
//   not, unless the device is idle. So the pool calls synchronize() before
//   raw_free() (cudaFree synchronizes anyway; a fake or an asynchronous
//   backing might not).
//
// Note [Pending blocks are never merged]
//   Merging only absorbs kFree neighbours, so a kPending block, which pending_
//   may reference several times, is never deleted by a neighbour's free. It is
//   freed (and possibly deleted by merging) only after its last event is
//   processed, when pending_ no longer references it.
//
// Note [Allocation under capture]
//   While a CUDA graph is captured (capture_underway()), nothing is run: the
//   work is recorded. A block freed during the capture is reused by a later
//   request of the same stream, in the captured order, which is the order the
//   graph replays in, so that stays safe. Because blocks belong to their
//   stream, the Trainer's step stream is the graph's private pool: the blocks
//   the graph uses between its nodes stay free in the pool after the capture
//   but only requests on that stream, which after the capture runs nothing
//   but replays, could take them. What a capture must not do is touch events
//   (querying one recorded by the capture is an error) or synchronize: the
//   pool skips its lazy event collection; a block another stream used
//   (record_stream) that is freed during the capture gets no event, since
//   none could mark the end of work that has not run, and stays out of
//   circulation (kPending with no event) for the pool's lifetime -- freeing
//   happens in destructors, so refusing it would abort the process; and the
//   out-of-memory path, which synchronizes, fails with a message instead.

#include "runtime/alloc/caching_pool.h"

#include <cstdio>
#include <tuple>

#include "kernels/common/error.h"
#include "runtime/core/cuda_graph.h"

namespace bt {
namespace {
constexpr size_t kMaxRequest = size_t{1} << 60;  // keeps the rounding below from overflowing

size_t round_up(size_t n, size_t unit) { return (n + unit - 1) / unit * unit; }
}  // namespace

namespace alloc_detail {
std::string format_bytes(size_t n) {
  if (n < 1024) return cat(n, " bytes");
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 3) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f %s", v, units[u]);
  return cat(buf, " (", n, " bytes)");
}
}  // namespace alloc_detail

using alloc_detail::format_bytes;

bool CachingPool::BlockLess::operator()(const Block* a, const Block* b) const {
  return std::make_tuple(a->stream, a->size, reinterpret_cast<uintptr_t>(a->ptr)) <
         std::make_tuple(b->stream, b->size, reinterpret_cast<uintptr_t>(b->ptr));
}

size_t CachingPool::round_size(size_t nbytes) {
  return nbytes < kMinBlockSize ? kMinBlockSize : round_up(nbytes, kMinBlockSize);
}

size_t CachingPool::segment_size(size_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return round_up(rounded, kRoundLarge);
}

CachingPool::CachingPool(BackingAllocator& backing) : backing_(backing) {}

CachingPool::~CachingPool() {
  try {
    if (!pending_.empty()) {
      backing_.synchronize();
      for (auto& [ev, b] : pending_) backing_.release_event(ev);
      pending_.clear();
    }
    for (auto& [base, head] : segments_) {
      backing_.raw_free(base);
      for (Block* b = head; b != nullptr;) {
        Block* next = b->next;
        delete b;
        b = next;
      }
    }
  } catch (...) {
    // A destructor must not throw; the device is failing anyway.
  }
}

// ------------------------------------------------------------------ public API

void* CachingPool::allocate(size_t nbytes, uintptr_t stream) {
  BT_CHECK(nbytes <= kMaxRequest, "cannot allocate ", nbytes, " bytes on ", backing_.name(),
           ": the request is larger than any device memory (a negative size converted to size_t?)");
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.num_allocs;
  if (!capture_underway()) process_events();  // Note [Allocation under capture]
  const size_t size = round_size(nbytes);
  const bool small = size <= kSmallSize;
  Block* b = find_free(size, small, stream);
  if (b == nullptr) b = new_segment(size, small, stream, nbytes);
  return take(b, size);
}

void CachingPool::deallocate(void* p) {
  if (p == nullptr) return;
  BT_ASSERT(deallocate_if_owned(p), "deallocate(", p, ") on ", backing_.name(),
            ": not a live block of this allocator (double free, or memory from another allocator)");
}

bool CachingPool::deallocate_if_owned(void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) return false;
  Block* b = it->second;
  live_.erase(it);
  stats_.allocated -= b->size;
  if (b->stream_uses.empty()) {
    free_block(b);  // reusable by its own stream at once (stream order)
    return true;
  }
  if (capture_underway()) {  // Note [Allocation under capture]: no event could mark its last use
    b->stream_uses.clear();
    b->state = BlockState::kPending;  // with no event: out of circulation for the pool's lifetime
    return true;
  }
  std::vector<uintptr_t> uses;
  uses.swap(b->stream_uses);
  b->state = BlockState::kPending;
  for (uintptr_t s : uses) {
    const uint64_t ev = backing_.record_event(s);
    pending_.emplace_back(ev, b);
    ++b->pending_events;
  }
  return true;
}

void CachingPool::record_stream(void* p, uintptr_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  BT_ASSERT(it != live_.end(), "record_stream(", p, ") on ", backing_.name(),
            ": not a live block of this allocator");
  Block* b = it->second;
  if (stream == b->stream) return;
  for (uintptr_t s : b->stream_uses)
    if (s == stream) return;
  b->stream_uses.push_back(stream);
}

void CachingPool::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  const bool synchronized = !pending_.empty();
  synchronize_and_process_events();
  release_free_segments(synchronized);
}

AllocatorStats CachingPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingPool::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated = stats_.allocated;
  stats_.peak_reserved = stats_.reserved;
}

std::vector<CachingPool::SegmentInfo> CachingPool::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SegmentInfo> out;
  out.reserve(segments_.size());
  for (const auto& [base, head] : segments_) {
    SegmentInfo seg{reinterpret_cast<uintptr_t>(base), 0, head->stream, head->small, {}};
    for (const Block* b = head; b != nullptr; b = b->next) {
      seg.blocks.push_back({reinterpret_cast<uintptr_t>(b->ptr), b->size, b->state});
      seg.size += b->size;
    }
    out.push_back(std::move(seg));
  }
  return out;
}

size_t CachingPool::block_size(const void* p) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(const_cast<void*>(p));
  BT_ASSERT(it != live_.end(), "block_size(", p, "): not a live block");
  return it->second->size;
}

// ------------------------------------------------------------------ internals
// Everything below runs with mu_ held.

CachingPool::Block* CachingPool::find_free(size_t size, bool small, uintptr_t stream) {
  FreeSet& set = free_set(small);
  Block key;
  key.stream = stream;
  key.size = size;
  key.ptr = nullptr;
  auto it = set.lower_bound(&key);  // smallest block of this stream with size >= `size`
  if (it == set.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  set.erase(it);
  return b;
}

CachingPool::Block* CachingPool::new_segment(size_t size, bool small, uintptr_t stream, size_t nbytes) {
  size_t seg = segment_size(size);
  void* p = backing_.raw_alloc(seg);
  if (p == nullptr) {
    BT_CHECK(!capture_underway(), "out of memory on ", backing_.name(),
             " while a CUDA graph is captured: ", format_bytes(nbytes), " requested with ",
             format_bytes(stats_.allocated), " allocated and ", format_bytes(stats_.reserved),
             " reserved; set train.cuda_graph: false, or reduce "
             "train.micro_batch");
    // Out of memory. Blocks waiting on events may be all we need.
    backing_.synchronize();
    process_events();
    if (Block* b = find_free(size, small, stream)) return b;
    // Flush the cache: segments that are entirely free, of every stream and pool.
    ++stats_.num_oom_retries;
    release_free_segments(/*synchronized=*/true);
    p = backing_.raw_alloc(seg);
    const size_t exact = round_up(size, kRoundLarge);
    if (p == nullptr && exact < seg) {
      p = backing_.raw_alloc(exact);
      if (p != nullptr) seg = exact;
    }
    if (p == nullptr) throw_oom(nbytes, seg);
  }
  Block* head = new Block;
  head->ptr = static_cast<char*>(p);
  head->size = seg;
  head->stream = stream;
  head->small = small;
  segments_.emplace(head->ptr, head);
  ++stats_.num_backing_mallocs;
  stats_.reserved += seg;
  if (stats_.reserved > stats_.peak_reserved) stats_.peak_reserved = stats_.reserved;
  return head;
}

// `b` is kFree (or a fresh segment head) and in no free set.
void* CachingPool::take(Block* b, size_t size) {
  BT_ASSERT(b->size >= size && b->state == BlockState::kFree);
  const size_t rest = b->size - size;
  const bool split = b->small ? rest >= kMinBlockSize : rest > kSmallSize;
  if (split) {
    // See Note [Segment heads are stable] and Note [No two free neighbours].
    Block* r = new Block;
    r->ptr = b->ptr + size;
    r->size = rest;
    r->stream = b->stream;
    r->small = b->small;
    r->prev = b;
    r->next = b->next;
    if (b->next != nullptr) b->next->prev = r;
    b->next = r;
    b->size = size;
    free_set(r->small).insert(r);
  }
  b->state = BlockState::kLive;
  live_.emplace(b->ptr, b);
  stats_.allocated += b->size;
  if (stats_.allocated > stats_.peak_allocated) stats_.peak_allocated = stats_.allocated;
  return b->ptr;
}

// Marks `b` free, merges it with free neighbours and puts the result into its free set.
void CachingPool::free_block(Block* b) {
  FreeSet& set = free_set(b->small);
  b->state = BlockState::kFree;
  b->stream_uses.clear();
  b->pending_events = 0;
  if (b->prev != nullptr && b->prev->state == BlockState::kFree) {
    Block* p = b->prev;
    set.erase(p);  // Note [Free-set keys are immutable]
    p->size += b->size;
    p->next = b->next;
    if (b->next != nullptr) b->next->prev = p;
    delete b;
    b = p;
  }
  if (b->next != nullptr && b->next->state == BlockState::kFree) {
    Block* n = b->next;
    set.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next != nullptr) n->next->prev = b;
    delete n;
  }
  set.insert(b);
}

// Returns to the pool the pending blocks whose events have all completed.
void CachingPool::process_events() {
  for (size_t i = 0; i < pending_.size();) {
    auto [ev, b] = pending_[i];
    if (!backing_.event_done(ev)) {
      ++i;
      continue;
    }
    pending_[i] = pending_.back();
    pending_.pop_back();
    if (--b->pending_events == 0) free_block(b);  // Note [Pending blocks are never merged]
    backing_.release_event(ev);
  }
}

void CachingPool::synchronize_and_process_events() {
  if (pending_.empty()) return;
  backing_.synchronize();
  process_events();
}

void CachingPool::release_segment(Block* head) {
  BT_ASSERT(head->prev == nullptr && head->next == nullptr && head->state == BlockState::kFree);
  backing_.raw_free(head->ptr);
  free_set(head->small).erase(head);
  segments_.erase(head->ptr);
  stats_.reserved -= head->size;
  ++stats_.num_backing_frees;
  delete head;
}

size_t CachingPool::release_free_segments(bool synchronized) {
  std::vector<Block*> heads;
  for (auto& [base, head] : segments_)
    if (head->next == nullptr && head->state == BlockState::kFree)
      heads.push_back(head);  // Note [No two free neighbours]
  if (heads.empty()) return 0;
  if (!synchronized) backing_.synchronize();  // Note [Synchronize before releasing segments]
  size_t released = 0;
  for (Block* head : heads) {
    released += head->size;
    release_segment(head);
  }
  return released;
}

void CachingPool::throw_oom(size_t nbytes, size_t seg) {
  size_t free_b = 0, total_b = 0;
  std::string device_info;
  if (backing_.memory_info(&free_b, &total_b))
    device_info =
        cat("; the device has ", format_bytes(total_b), " in total, of which ", format_bytes(free_b),
            " is free (memory held by other processes or libraries counts against it)");
  BT_FAIL("out of memory on ", backing_.name(), ": tried to allocate ", format_bytes(nbytes), " (a ",
          format_bytes(seg), " segment) after freeing all cached memory; ", format_bytes(stats_.allocated),
          " is allocated by live tensors and ", format_bytes(stats_.reserved),
          " is reserved by the caching allocator", device_info,
          ". To fit, reduce the (micro-)batch size or sequence length, enable activation checkpointing, "
          "use mixed precision, or free tensors that are no longer needed.");
}

}  // namespace bt
