#include "runtime/tensor/storage.h"

#include "kernels/common/error.h"

namespace bt {

std::atomic<PendingFlush> g_pending_flush{nullptr};

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, const Device& device, const Stream& stream,
                                           bool pinned) {
  auto s = std::make_shared<Storage>();
  s->allocator = pinned ? &pinned_allocator() : &allocator_for(device);
  s->data = s->allocator->allocate(nbytes, stream);
  s->nbytes = nbytes;
  s->device = device;
  s->pinned = pinned;
  return s;
}

void Storage::release() {
  // Note [Lazy fusion]: pending work that reads this memory is computed first,
  // as before a write (a recipe rebuilt in a ZeRO-3 unit's backward reads the
  // unit's gathered weights, which the unit releases when its backward ends).
  if (lazy_readers.load(std::memory_order_relaxed) > 0)
    if (const PendingFlush flush = g_pending_flush.load()) flush();
  if (allocator && data) allocator->deallocate(data);
  data = nullptr;
}

void Storage::reacquire(const Stream& stream) {
  BT_CHECK(allocator != nullptr,
           "Storage::reacquire: memory owned elsewhere (from_blob) cannot be reacquired");
  if (data == nullptr && nbytes > 0) data = allocator->allocate(nbytes, stream);
}

}  // namespace bt
