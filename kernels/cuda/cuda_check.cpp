#include "kernels/common/cuda_check.h"

namespace bt::detail {

void cuda_fail(cudaError_t e, const char* call, const char* file, int line) {
  std::string hint;
  if (e == cudaErrorMemoryAllocation)
    hint = " (out of GPU memory: reduce the batch size or free cached memory)";
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
    hint = " (no usable CUDA device: run on a GPU machine or use device: cpu)";
  throw Error(cat("CUDA error ", cudaGetErrorName(e), ": ", cudaGetErrorString(e), hint, " in ", call, " at ",
                  file, ":", line));
}

void cublas_fail(cublasStatus_t s, const char* call, const char* file, int line) {
  throw Error(cat("cuBLAS error ", cublasGetStatusName(s), ": ", cublasGetStatusString(s), " in ", call,
                  " at ", file, ":", line));
}

}  // namespace bt::detail
