#include "runtime/dist/checks.h"

namespace bt::detail {

void mpi_fail(int code, const char* call, const char* file, int line) {
  char msg[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, msg, &len) != MPI_SUCCESS) std::snprintf(msg, sizeof msg, "error code %d", code);
  throw Error(cat("MPI error: ", msg, " in ", call, " at ", file, ":", line));
}

#ifdef BT_NCCL
void nccl_fail(ncclResult_t r, const char* call, const char* file, int line) {
  const char* last = ncclGetLastError(nullptr);
  throw Error(cat("NCCL error ", static_cast<int>(r), ": ", ncclGetErrorString(r),
                  (last && *last) ? " (" : "", (last && *last) ? last : "", (last && *last) ? ")" : "",
                  " in ", call, " at ", file, ":", line));
}
#endif

}  // namespace bt::detail
