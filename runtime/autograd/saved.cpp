#include "runtime/autograd/saved.h"

namespace bt {

SavedTensor::SavedTensor(const Tensor& t, const char* op) : op_(op) {
  if (!t.defined()) return;
  data_ = t.detach();
  version_ = t.version();
}

Tensor SavedTensor::unpack() const {
  BT_CHECK(!released_, "trying to backward through the graph a second time (op ", op_,
           "): its saved tensors were freed after the first backward. Pass retain_graph=true to the first "
           "backward() if you need to run backward twice");
  if (!data_.defined()) return data_;
  BT_CHECK(data_.version() == version_, "a tensor saved by ", op_,
           " for backward was modified in place (version ", version_, " at save, now ", data_.version(),
           "). Use an out-of-place op, or clone() the tensor before modifying it");
  return data_;
}

}  // namespace bt
