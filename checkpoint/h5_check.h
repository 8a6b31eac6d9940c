// Check macro for HDF5 calls. HDF5 reports failure as a negative return value
// (herr_t or hid_t); the message includes HDF5's own innermost error text.
#pragma once

#include <hdf5.h>

#include "kernels/common/error.h"

namespace bt::detail {
[[noreturn]] void h5_fail(const char* call, const char* file, int line);
/// Turns off HDF5's automatic error printing (errors become bt::Error instead).
void h5_silence_auto_errors();
}  // namespace bt::detail

/// Evaluates `call`; a negative result throws bt::Error. Yields the result.
#define BT_H5_CHECK(call)                                                \
  ([&]() {                                                               \
    auto bt_h5_rc_ = (call);                                             \
    if (bt_h5_rc_ < 0) ::bt::detail::h5_fail(#call, __FILE__, __LINE__); \
    return bt_h5_rc_;                                                    \
  }())
