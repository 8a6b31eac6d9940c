#include "runtime/tensor/storage.h"

namespace bt {

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

}  // namespace bt
