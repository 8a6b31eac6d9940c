// The allocator interface that tensor storage draws from, and the allocators
// for each kind of memory. See runtime/alloc/caching_pool.h for the CUDA
// caching policy and runtime/alloc/pinned_allocator.h for pinned host memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/core/device.h"
#include "runtime/core/stream.h"

namespace bt {

class Allocator {
 public:
  virtual ~Allocator() = default;
  /// Memory for `nbytes` (>= 1 byte is always returned for nbytes == 0), usable
  /// in stream order on `stream`. Throws bt::Error when memory is exhausted.
  virtual void* allocate(size_t nbytes, const Stream& stream) = 0;
  /// Returns memory from allocate(). Work already queued on its streams may
  /// still use it; the allocator makes sure no later user overlaps that work.
  virtual void deallocate(void* ptr) = 0;
  /// Declares that `ptr` is also used on `stream`, so its reuse waits for it.
  virtual void record_stream(void* ptr, const Stream& stream) {}
};

/// Statistics of one device's caching allocator (bytes unless noted).
struct AllocatorStats {
  size_t allocated = 0;       // in live blocks handed to callers
  size_t reserved = 0;        // obtained from the backing allocator (cudaMalloc)
  size_t peak_allocated = 0;  // max of `allocated` since the last reset_peak
  size_t peak_reserved = 0;
  uint64_t num_allocs = 0;           // allocate() calls
  uint64_t num_backing_mallocs = 0;  // cudaMalloc calls
  uint64_t num_backing_frees = 0;    // cudaFree calls
  uint64_t num_oom_retries = 0;      // times the cache was flushed to retry
};

/// 64-byte aligned host memory: from the C heap, and blocks of 4 MiB or more
/// from a cache (Note [Large host blocks], runtime/alloc/cpu_allocator.cpp).
Allocator& cpu_allocator();
/// Whether cpu_allocator() caches large blocks (not with BT_CPU_CACHE=0, nor
/// under AddressSanitizer).
bool cpu_block_cache_enabled();
/// The caching allocator of CUDA device `index`.
Allocator& cuda_allocator(int index);
/// Page-locked host memory for fast, asynchronous host<->device copies. Falls
/// back to ordinary host memory when BluTrain has no CUDA device.
Allocator& pinned_allocator();
/// The allocator for tensors on `d`.
Allocator& allocator_for(const Device& d);

AllocatorStats cuda_memory_stats(int index);
void cuda_reset_peak_stats(int index);
/// Returns every cached, unused block of device `index` to the driver.
void cuda_empty_cache(int index);

}  // namespace bt
