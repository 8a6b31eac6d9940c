// How an op reaches its kernel: argument checks shared by the ops, and
// on_device(), which runs the CPU kernel or, for CUDA tensors, the CUDA kernel
// on the device's current stream. In a build without CUDA the CUDA branch is
// not compiled (BT_CUDA_LAMBDA expands to nullptr) and using a CUDA tensor
// fails with a clear error: that is the "stub" backend.
#pragma once

#include <initializer_list>
#include <type_traits>

#include "kernels/common/layout.h"
#include "runtime/tensor/tensor.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>
#endif

namespace bt::detail {

[[noreturn]] void no_cuda();

#ifdef BT_CUDA
inline cudaStream_t cuda_stream_of(const Device& d) {
  return static_cast<cudaStream_t>(Stream::current(d).handle());
}
#define BT_CUDA_LAMBDA(...) [&](cudaStream_t stream) { __VA_ARGS__; }
#else
#define BT_CUDA_LAMBDA(...) nullptr
#endif

template <typename CpuF, typename CudaF>
void on_device(const Device& d, CpuF&& cpu, CudaF&& cuda) {
  if (!d.is_cuda()) {
    cpu();
    return;
  }
  if constexpr (std::is_same_v<std::decay_t<CudaF>, std::nullptr_t>) {
    no_cuda();
  } else {
#ifdef BT_CUDA
    DeviceGuard guard(d);
    cuda(cuda_stream_of(d));
#endif
  }
}

/// Layout of t's view (shape and strides); throws if t has more than kMaxDims dims.
kernels::StridedLayout layout_of(const Tensor& t);
/// Layout of t broadcast to `shape` (stride 0 on broadcast dims).
kernels::StridedLayout broadcast_layout(const Tensor& t, const Shape& shape);

void check_defined(const char* op, const Tensor& t, const char* arg);
void check_same_device(const char* op, const Tensor& a, const Tensor& b);
void check_same_dtype(const char* op, const Tensor& a, const Tensor& b);
void check_dtype(const char* op, const Tensor& t, const char* arg, std::initializer_list<DType> allowed);
void check_dim(const char* op, const Tensor& t, const char* arg, int ndim);

}  // namespace bt::detail
