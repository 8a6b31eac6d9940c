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

  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (allocator && data) allocator->deallocate(data);
  }

  static std::shared_ptr<Storage> allocate(size_t nbytes, const Device& device, const Stream& stream,
                                           bool pinned = false);
};

}  // namespace bt
