#include "runtime/autograd/saved.h"

#include "runtime/autograd/grad_mode.h"
#include "runtime/autograd/recompute.h"

namespace bt {
namespace {

/// `geometry`'s view (shape, strides, offset, dtype) over `storage`.
Tensor view_over(const Tensor& geometry, std::shared_ptr<Storage> storage, const Stream& stream) {
  Tensor t = geometry.detach();
  t.impl()->storage = std::move(storage);
  t.impl()->stream = stream;
  return t;
}

}  // namespace

// Note [Selective recompute]
// Under train.recompute = selective, LayerNorm and GELU tag the storage of
// their output with a recipe (runtime/autograd/recompute.h) that reruns the
// same kernel on tensors their own backward keeps anyway (the LayerNorm input
// and affine -- for add_layer_norm, the sum it saved -- the GELU
// pre-activation). A later op saving that output -- the
// Linear that reads it -- keeps the recipe and the view's geometry instead of
// the storage, so the activation is freed as soon as the forward is done with
// it; unpack() reruns the recipe in backward and the gradient formula sees the
// same bits the forward used (the recipe must be bitwise faithful: it calls
// the kernel that made the tensor, never an approximation of it). An in-place
// write to the storage marks the tag written: a save after it keeps the
// memory as usual, and an unpack of a recipe saved before it fails like a
// version mismatch. What it saves on GPT-2: the two LayerNorm outputs and the
// GELU output of each block, 6 of 16 activations of width C.
SavedTensor::SavedTensor(const Tensor& t, const char* op) : op_(op) {
  if (!t.defined()) return;
  const std::shared_ptr<RecomputeTag>& tag = t.impl()->storage->recompute;
  if (tag && !tag->written) {
    recipe_ = std::static_pointer_cast<autograd::Recipe>(tag);
    auto placeholder = std::make_shared<Storage>();
    placeholder->device = t.device();
    placeholder->nbytes = t.impl()->storage->nbytes;
    data_ = view_over(t, std::move(placeholder), t.stream());
    return;
  }
  data_ = t.detach();
  version_ = t.version();
}

Tensor SavedTensor::unpack() const {
  BT_CHECK(!released_, "trying to backward through the graph a second time (op ", op_,
           "): its saved tensors were freed after the first backward. Pass retain_graph=true to the first "
           "backward() if you need to run backward twice");
  if (recipe_) {
    BT_CHECK(!recipe_->written, "a tensor saved by ", op_,
             " for backward (kept as a recompute recipe, Note [Selective recompute]) was modified in place "
             "after it was saved. Use an out-of-place op, or clone() the tensor before modifying it");
    Tensor base;
    {
      NoGradGuard no_grad;
      base = recipe_->make();
    }
    BT_ASSERT(base.offset() == 0 && base.nbytes() == data_.impl()->storage->nbytes, op_,
              ": a recompute recipe rebuilt ", base.nbytes(), " bytes for a storage of ",
              data_.impl()->storage->nbytes);
    return view_over(data_, base.impl_ptr()->storage, base.stream());
  }
  if (!data_.defined()) return data_;
  BT_CHECK(data_.version() == version_, "a tensor saved by ", op_,
           " for backward was modified in place (version ", version_, " at save, now ", data_.version(),
           "). Use an out-of-place op, or clone() the tensor before modifying it");
  return data_;
}

}  // namespace bt
