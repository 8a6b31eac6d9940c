// The memory behind one or more tensor views.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "runtime/alloc/allocator.h"
#include "runtime/core/device.h"
#include "runtime/core/stream.h"

namespace bt {

/// What autograd's selective recompute hangs on a storage it can rebuild
/// (runtime/autograd/recompute.h derives the recipe from it). Any in-place
/// write to the storage sets `written`: the recipe no longer describes it.
struct RecomputeTag {
  std::atomic<bool> written{false};
  virtual ~RecomputeTag() = default;
};

/// What runtime/compile/lazy.cpp hangs on a storage whose values are not
/// computed yet (Note [Lazy fusion] in runtime/compile/lazy.h).
struct PendingValue {
  virtual ~PendingValue() = default;
};

/// Computes every pending value: what a read or write of a storage that is
/// pending, or read by pending work, runs first (Tensor::data_ptr). Set by
/// runtime/compile/lazy.cpp; null (nothing to do) until lazy fusion is used.
using PendingFlush = void (*)();
extern std::atomic<PendingFlush> g_pending_flush;

// Note [Version counter]
// Every in-place write to a storage bumps `version`. Views share the storage
// and so share the counter. Autograd records the version of each tensor it
// saves for backward and refuses to use it if the version moved: the values
// the gradient formula needs are gone.
struct Storage {
  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  Allocator* allocator = nullptr;  // null: memory owned elsewhere (from_blob)
  bool pinned = false;
  std::atomic<uint64_t> version{0};
  std::shared_ptr<RecomputeTag> recompute;  // Note [Selective recompute]
  /// Note [Lazy fusion]: set while the values are not computed (data is null);
  /// lazy_readers counts the pending ops that read this storage.
  std::shared_ptr<PendingValue> pending;
  std::atomic<int> lazy_readers{0};

  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (allocator && data) allocator->deallocate(data);
  }

  static std::shared_ptr<Storage> allocate(size_t nbytes, const Device& device, const Stream& stream,
                                           bool pinned = false);

  // Note [Released storage]
  // release() gives the memory back to the allocator but keeps this object,
  // so every view of it -- tensors autograd saved for backward included --
  // stays a valid handle whose data is absent; reacquire() allocates nbytes
  // again (new contents undefined) before anyone reads it. ZeRO-3 keeps the
  // gathered weights of a unit this way between its forward and backward
  // (runtime/dist/zero3.h). Reading released data fails in Tensor::data_ptr.
  // The version counter is untouched: refilling with the same values is not
  // a write autograd must see. Pending lazy work that reads the storage is
  // computed before the memory goes (Note [Lazy fusion]).
  void release();
  void reacquire(const Stream& stream);
  bool resident() const { return data != nullptr || nbytes == 0; }
};

}  // namespace bt
