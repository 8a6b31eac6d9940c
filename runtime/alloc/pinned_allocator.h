// Pinned (page-locked) host memory: pinned_allocator() is declared in
// runtime/alloc/allocator.h; this header adds its cache controls.
//
// ============================================================================ POLICY
// Memory.  With a usable CUDA device (cuda_available()), blocks are page-locked
//   with cudaHostAlloc(cudaHostAllocPortable), so every device can copy to and
//   from them asynchronously. Without one (built without CUDA, or no GPU
//   visible) the allocator falls back to ordinary 64-byte aligned host memory
//   from std::aligned_alloc, with the same caching; callers need not care,
//   copies from it are simply synchronous-speed. The mode is fixed at first use.
//
// Size classes.  Pinning and unpinning are expensive (a system call that walks
//   the page tables, and cudaFreeHost synchronizes the device), so freed blocks
//   are cached and reused. A request is rounded up to its size class: the next
//   power of two from 4 KiB up to 1 GiB, then the next multiple of 2 MiB.
//   A cached block is reused only by a request of exactly the same class, so
//   repeated data-loader batches and checkpoint buffers of the same shape hit
//   the cache and never re-pin.
//
// Streams.  A pinned block is typically the source or target of an
//   asynchronous copy. Its reuse must wait for that copy:
//     - a CUDA stream passed to allocate(), and every CUDA stream passed to
//       record_stream(), counts as a user of the block;
//     - deallocate() records an event on each user stream (on that stream's
//       device) and the block becomes reusable only when all of those events
//       have completed (checked lazily, at allocate(), pinned_cached_bytes()
//       and pinned_empty_cache());
//     - with no CUDA user streams the block is reusable at once.
//   In the fallback mode there is no device work, and streams are ignored.
//
// Out of memory.  If pinning fails, the cache is emptied and the allocation
//   retried once; then bt::Error names the size and what to do.
//
// The allocator is never destroyed (like the CUDA ones), and is thread-safe
// (one mutex). Freeing a pointer that it did not hand out is a BluTrain bug
// (BT_ASSERT); deallocate(nullptr) does nothing.
// ============================================================================
#pragma once

#include <cstddef>

#include "runtime/alloc/allocator.h"

namespace bt {

/// Bytes held in pinned blocks that are cached and free for reuse.
size_t pinned_cached_bytes();
/// Releases every cached free pinned block (blocks still waiting for their
/// copies to complete stay until they do).
void pinned_empty_cache();
/// The size class, i.e. the bytes actually reserved, for a request of `nbytes`.
size_t pinned_size_class(size_t nbytes);

}  // namespace bt
