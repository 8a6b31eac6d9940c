// The object a Tensor handle points to: storage plus a strided view of it.
// Autograd metadata is optional and defined in runtime/autograd/meta.h.
#pragma once

#include <memory>

#include "kernels/common/dtype.h"
#include "runtime/core/stream.h"
#include "runtime/tensor/shape.h"
#include "runtime/tensor/storage.h"

namespace bt {

struct AutogradMeta;

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;       // in elements
  int64_t offset = 0;  // in elements from storage->data
  DType dtype = DType::F32;
  Stream stream;  // the stream the storage was allocated on
  std::unique_ptr<AutogradMeta> autograd;

  TensorImpl();
  ~TensorImpl();
};

}  // namespace bt
