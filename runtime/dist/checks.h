// Check macros for MPI and NCCL calls: a failure becomes a bt::Error naming
// the call, file:line and the library's error string.
#pragma once

#include <mpi.h>

#include "kernels/common/error.h"
#ifdef BT_NCCL
#include <nccl.h>
#endif

namespace bt::detail {
[[noreturn]] void mpi_fail(int code, const char* call, const char* file, int line);
#ifdef BT_NCCL
[[noreturn]] void nccl_fail(ncclResult_t r, const char* call, const char* file, int line);
#endif
}  // namespace bt::detail

/// For MPI calls on communicators whose error handler is MPI_ERRORS_RETURN.
#define BT_MPI_CHECK(call)                                                                        \
  do {                                                                                            \
    int bt_mpi_rc_ = (call);                                                                      \
    if (bt_mpi_rc_ != MPI_SUCCESS) ::bt::detail::mpi_fail(bt_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)

#ifdef BT_NCCL
#define BT_NCCL_CHECK(call)                                            \
  do {                                                                 \
    ncclResult_t bt_nccl_rc_ = (call);                                 \
    if (bt_nccl_rc_ != ncclSuccess && bt_nccl_rc_ != ncclInProgress)   \
      ::bt::detail::nccl_fail(bt_nccl_rc_, #call, __FILE__, __LINE__); \
  } while (0)
#endif
