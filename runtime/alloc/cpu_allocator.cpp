// cpu_allocator(): 64-byte aligned host memory, and allocator_for(Device).
//
// Note [Large host blocks]: glibc's malloc caches small blocks, but it serves
// every request above its mmap threshold (at most 32 MiB) with a fresh mmap
// and gives it back to the kernel at free(). A CPU training step allocates
// and frees the same large buffers every step (the tiny GPT's logits and
// their gradient are 412 MB each), so each step page-faulted them in again.
// On the 2-core development machine (AMD EPYC, 2026-11-24), `blutrain bench
// --device cpu --preset tiny --micro-batch 8 --seq 256 --steps 10`: 2.3K
// tokens/s with 4.8 s of system time in the 10.9 s run; with this cache 3.3K
// tokens/s and 3.4 s. So requests of kLargeHostBlock and more come from a CachingPool (the CUDA
// allocator's policy, caching_pool.h) over 2 MiB-aligned segments marked for
// transparent huge pages; smaller ones still come from the C heap. CPU work is
// synchronous, so the pool's one stream is 0 and its events are complete at
// once. BT_CPU_CACHE=0 turns the cache off (every block from the C heap), and
// so does AddressSanitizer: a reused block would hide a use after free.
#include <cstdlib>
#include <cstring>

#include <sys/mman.h>

#include "kernels/common/error.h"
#include "runtime/alloc/allocator.h"
#include "runtime/alloc/caching_pool.h"

namespace bt {
namespace {

constexpr size_t kCpuAlignment = 64;                   // a cache line; enough for any SIMD load
constexpr size_t kSegmentAlignment = size_t{2} << 20;  // a transparent huge page
constexpr size_t kLargeHostBlock = size_t{4} << 20;

/// Host memory for the pool's segments: 2 MiB-aligned, huge pages advised.
class HostBacking final : public BackingAllocator {
 public:
  void* raw_alloc(size_t bytes) override {
    void* p = std::aligned_alloc(kSegmentAlignment,
                                 (bytes + kSegmentAlignment - 1) / kSegmentAlignment * kSegmentAlignment);
    if (p != nullptr) ::madvise(p, bytes, MADV_HUGEPAGE);  // advice only: failure changes nothing
    return p;
  }
  void raw_free(void* p) override { std::free(p); }
  uint64_t record_event(uintptr_t) override { return 0; }
  bool event_done(uint64_t) override { return true; }
  void release_event(uint64_t) override {}
  void synchronize() override {}
  std::string name() const override { return "cpu"; }
};

}  // namespace

bool cpu_block_cache_enabled() {
#if defined(__SANITIZE_ADDRESS__)
  return false;
#else
  const char* v = std::getenv("BT_CPU_CACHE");
  return v == nullptr || std::strcmp(v, "0") != 0;
#endif
}

namespace {

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, const Stream& /*stream: CPU work is synchronous*/) override {
    BT_CHECK(nbytes <= (size_t{1} << 60), "cannot allocate ", nbytes,
             " bytes of host memory (a negative size converted to size_t?)");
    if (nbytes >= kLargeHostBlock && cache_) return pool_.allocate(nbytes, 0);
    // std::aligned_alloc needs a size that is a multiple of the alignment; 0 B
    // becomes one cache line so every allocation is a distinct, valid pointer.
    const size_t size =
        nbytes == 0 ? kCpuAlignment : (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* p = std::aligned_alloc(kCpuAlignment, size);
    BT_CHECK(p != nullptr, "out of host memory: tried to allocate ", alloc_detail::format_bytes(nbytes),
             "; reduce the batch size, the data-loader prefetch depth, or the number of workers");
    return p;
  }
  void deallocate(void* ptr) override {
    if (ptr == nullptr || (cache_ && pool_.deallocate_if_owned(ptr))) return;
    std::free(ptr);
  }

 private:
  HostBacking backing_;
  CachingPool pool_{backing_};
  const bool cache_ = cpu_block_cache_enabled();
};

}  // namespace

Allocator& cpu_allocator() {
  // Never destroyed: tensors freed during static destruction may still use it.
  static CpuAllocator* a = new CpuAllocator;
  return *a;
}

Allocator& allocator_for(const Device& d) {
  if (d.is_cpu()) return cpu_allocator();
  return cuda_allocator(d.index);
}

}  // namespace bt
