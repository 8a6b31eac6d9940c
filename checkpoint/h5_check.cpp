#include "checkpoint/h5_check.h"

#include <string>

namespace bt::detail {
namespace {

herr_t collect(unsigned n, const H5E_error2_t* e, void* out) {
  auto* s = static_cast<std::string*>(out);
  if (n == 0 && e && e->desc) *s = e->desc;  // the innermost (first) error
  return 0;
}

}  // namespace

void h5_silence_auto_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

void h5_fail(const char* call, const char* file, int line) {
  std::string desc;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect, &desc);
  H5Eclear2(H5E_DEFAULT);
  throw Error(cat("HDF5 error", desc.empty() ? "" : ": ", desc, " in ", call, " at ", file, ":", line));
}

}  // namespace bt::detail
