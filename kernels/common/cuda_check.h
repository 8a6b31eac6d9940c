// Check macros for CUDA runtime and cuBLAS calls. Each failure becomes a bt::Error
// that records the call, file:line and the library's own error string.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kernels/common/error.h"

namespace bt::detail {
[[noreturn]] void cuda_fail(cudaError_t e, const char* call, const char* file, int line);
[[noreturn]] void cublas_fail(cublasStatus_t s, const char* call, const char* file, int line);
}  // namespace bt::detail

#define BT_CUDA_CHECK(call)                                                                  \
  do {                                                                                       \
    cudaError_t bt_err_ = (call);                                                            \
    if (bt_err_ != cudaSuccess) ::bt::detail::cuda_fail(bt_err_, #call, __FILE__, __LINE__); \
  } while (0)

#define BT_CUBLAS_CHECK(call)                                                                          \
  do {                                                                                                 \
    cublasStatus_t bt_st_ = (call);                                                                    \
    if (bt_st_ != CUBLAS_STATUS_SUCCESS) ::bt::detail::cublas_fail(bt_st_, #call, __FILE__, __LINE__); \
  } while (0)

/// After a kernel launch: reports launch-configuration errors with file:line.
#define BT_KERNEL_CHECK() BT_CUDA_CHECK(cudaGetLastError())
