// The pinned host allocator. Policy at the top of pinned_allocator.h.
//
// Note [Pinned block states]
//   Every block handed out by the backing (cudaHostAlloc or aligned_alloc) is
//   in blocks_ until it is released, in one of three states: kLive (the
//   caller's), kPending (freed, waiting for `pending` events) or kCached (in
//   free_[size class], ready for reuse). Only kCached blocks count in
//   cached_bytes_ and only they are ever released.

#include "runtime/alloc/pinned_allocator.h"

#include <bit>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/common/error.h"
#include "runtime/alloc/caching_pool.h"
#include "runtime/core/cuda_graph.h"
#include "runtime/core/device.h"
#include "runtime/core/stream.h"
#ifdef BT_CUDA
#include "kernels/common/cuda_check.h"
#endif

namespace bt {
namespace {

constexpr size_t kMinClass = size_t{4} << 10;      // 4 KiB: one page
constexpr size_t kMaxPow2Class = size_t{1} << 30;  // 1 GiB
constexpr size_t kLargeRound = size_t{2} << 20;    // 2 MiB
constexpr size_t kFallbackAlignment = 64;

class PinnedAllocator final : public Allocator {
 public:
  PinnedAllocator() : page_locked_(cuda_available()) {}

  void* allocate(size_t nbytes, const Stream& stream) override {
    const size_t cls = pinned_size_class(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    process_events();
    void* p = nullptr;
    auto fit = free_.find(cls);
    if (fit != free_.end() && !fit->second.empty()) {
      p = fit->second.back();
      fit->second.pop_back();
      cached_bytes_ -= cls;
    } else {
      p = raw_alloc(cls);
      if (p == nullptr) {
        release_cached();
        p = raw_alloc(cls);
      }
      BT_CHECK(
          p != nullptr, "out of ", page_locked_ ? "pinned (page-locked) " : "",
          "host memory: tried to allocate ", alloc_detail::format_bytes(nbytes), " (size class ",
          alloc_detail::format_bytes(cls),
          ") after releasing all cached pinned blocks; reduce the data-loader prefetch depth or batch size, "
          "or raise the locked-memory limit (ulimit -l) of the job");
      Block nb;
      nb.size = cls;
      blocks_.emplace(p, std::move(nb));
    }
    Block& b = blocks_.at(p);
    b.state = State::kLive;
    b.uses.clear();
    add_use(b, stream);
    return p;
  }

  void deallocate(void* ptr) override {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(ptr);
    BT_ASSERT(it != blocks_.end() && it->second.state == State::kLive, "pinned deallocate(", ptr,
              "): not a live pinned block (double free, or memory from another allocator)");
    Block& b = it->second;
    if (b.uses.empty()) {
      cache(ptr, b);
      return;
    }
    if (capture_underway()) {
      // No event could mark the end of captured copies that have not run
      // (Note [Allocation under capture] in runtime/alloc/caching_pool.cpp):
      // the block leaves circulation (pending, with no event) for good.
      b.uses.clear();
      b.state = State::kPending;
      return;
    }
    b.state = State::kPending;
    std::vector<Stream> uses;
    uses.swap(b.uses);
    for (const Stream& s : uses) {
      pending_.push_back({record_event(s), s.device().index, ptr});
      ++b.pending;
    }
  }

  void record_stream(void* ptr, const Stream& stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(ptr);
    BT_ASSERT(it != blocks_.end() && it->second.state == State::kLive, "pinned record_stream(", ptr,
              "): not a live pinned block");
    add_use(it->second, stream);
  }

  size_t cached_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    process_events();
    return cached_bytes_;
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    process_events();
    release_cached();
  }

 private:
  enum class State : uint8_t { kLive, kPending, kCached };
  struct Block {
    size_t size = 0;
    State state = State::kLive;
    int pending = 0;
    std::vector<Stream> uses;  // CUDA streams that use it, while kLive
  };
  struct PendingEvent {
    void* event;  // cudaEvent_t
    int device;
    void* ptr;
  };

  void add_use(Block& b, const Stream& s) {
    if (!page_locked_ || !s.device().is_cuda()) return;  // no async device work on it
    for (const Stream& u : b.uses)
      if (u == s) return;
    b.uses.push_back(s);
  }

  void cache(void* p, Block& b) {
    b.state = State::kCached;
    b.pending = 0;
    b.uses.clear();
    free_[b.size].push_back(p);
    cached_bytes_ += b.size;
  }

  void process_events() {
    for (size_t i = 0; i < pending_.size();) {
      PendingEvent pe = pending_[i];
      if (!event_done(pe.event)) {
        ++i;
        continue;
      }
      pending_[i] = pending_.back();
      pending_.pop_back();
      Block& b = blocks_.at(pe.ptr);
      if (--b.pending == 0) cache(pe.ptr, b);
      event_pool_[pe.device].push_back(pe.event);
    }
  }

  void release_cached() {
    for (auto& [cls, ptrs] : free_) {
      while (!ptrs.empty()) {
        void* p = ptrs.back();
        raw_free(p);
        ptrs.pop_back();
        blocks_.erase(p);
        cached_bytes_ -= cls;
      }
    }
  }

  // ---------------------------------------------------------- the backing
  void* raw_alloc(size_t bytes) {
#ifdef BT_CUDA
    if (page_locked_) {
      void* p = nullptr;
      const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
      if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return nullptr;
      }
      BT_CUDA_CHECK(e);
      return p;
    }
#endif
    return std::aligned_alloc(kFallbackAlignment, bytes);  // size classes are multiples of 4 KiB
  }

  void raw_free(void* p) {
#ifdef BT_CUDA
    if (page_locked_) {
      BT_CUDA_CHECK(cudaFreeHost(p));
      return;
    }
#endif
    std::free(p);
  }

  // Only called in page-locked mode, i.e. with CUDA (see add_use).
  void* record_event(const Stream& s) {
#ifdef BT_CUDA
    DeviceGuard g(s.device());  // an event is recorded on its own device's streams
    auto& pool = event_pool_[s.device().index];
    cudaEvent_t ev = nullptr;
    if (!pool.empty()) {
      ev = static_cast<cudaEvent_t>(pool.back());
      pool.pop_back();
    } else {
      BT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    }
    const cudaError_t e = cudaEventRecord(ev, static_cast<cudaStream_t>(s.handle()));
    if (e != cudaSuccess) {
      pool.push_back(ev);
      BT_CUDA_CHECK(e);
    }
    return ev;
#else
    BT_ASSERT(false, "pinned record_event without CUDA");
    return nullptr;
#endif
  }

  bool event_done(void* ev) {
#ifdef BT_CUDA
    const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(ev));
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    BT_CUDA_CHECK(e);
#endif
    return true;
  }

  const bool page_locked_;
  std::mutex mu_;
  std::unordered_map<void*, Block> blocks_;              // Note [Pinned block states]
  std::unordered_map<size_t, std::vector<void*>> free_;  // size class -> cached blocks
  std::vector<PendingEvent> pending_;
  std::unordered_map<int, std::vector<void*>> event_pool_;  // device -> completed events
  size_t cached_bytes_ = 0;
};

PinnedAllocator& pinned() {
  static PinnedAllocator* a = new PinnedAllocator;  // never destroyed, see pinned_allocator.h
  return *a;
}

}  // namespace

size_t pinned_size_class(size_t nbytes) {
  BT_CHECK(nbytes <= (size_t{1} << 60), "cannot allocate ", nbytes,
           " bytes of pinned memory (a negative size converted to size_t?)");
  if (nbytes <= kMinClass) return kMinClass;
  if (nbytes <= kMaxPow2Class) return std::bit_ceil(nbytes);
  return (nbytes + kLargeRound - 1) / kLargeRound * kLargeRound;
}

Allocator& pinned_allocator() { return pinned(); }
size_t pinned_cached_bytes() { return pinned().cached_bytes(); }
void pinned_empty_cache() { pinned().empty_cache(); }

}  // namespace bt
