// The tensor maps of kernels/cuda/sm90a/tma_map.h, encoded by the driver's
// cuTensorMapEncodeTiled, found through the CUDA runtime
// (cudaGetDriverEntryPointByVersion) so that nothing links libcuda.
#include <mutex>
#include <string>

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "kernels/common/error.h"
#include "kernels/cuda/sm90a/tma_map.h"

namespace bt::kernels::cuda::detail {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t e =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // no sticky error for the next CUDA call to find
      p = nullptr;
    }
    fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  });
  BT_CHECK(fn != nullptr,
           "the CUDA driver's cuTensorMapEncodeTiled was not found: the Hopper attention kernels need an "
           "NVIDIA driver for CUDA 12 or later (BT_ATTENTION_WGMMA=0 runs the mma.sync kernels instead)");
  return fn;
}

}  // namespace

CUtensorMap tma_map_bf16_rows64(const void* base, int64_t B, int64_t heads, int64_t T, const AttnStrides& st,
                                int rows) {
  constexpr int64_t kElem = 2, kD = 64;
  // A dimension of one entry never steps, so its stride may be anything the
  // caller had; the copy engine still wants a multiple of 16 bytes.
  const auto stride = [&](int64_t n, int64_t s) {
    return static_cast<cuuint64_t>(n > 1 ? s * kElem : kD * kElem);
  };
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(kD), static_cast<cuuint64_t>(T),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(B)};
  const cuuint64_t strides[3] = {stride(T, st.t), stride(heads, st.h), stride(B, st.b)};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(kD), static_cast<cuuint32_t>(rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  CUtensorMap map{};
  const CUresult r =
      encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), dims, strides, box,
                     elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  BT_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (CUresult ", static_cast<int>(r), ") for a [", B,
           ", ", heads, ", ", T, ", 64] bf16 view at ", base, " with strides (b ", st.b, ", h ", st.h, ", t ",
           st.t, ") and boxes of ", rows, " rows");
  return map;
}

}  // namespace bt::kernels::cuda::detail
