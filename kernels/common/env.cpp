#include "kernels/common/env.h"

#include <cerrno>
#include <cstdlib>

#include "kernels/common/error.h"

namespace bt {

int64_t env_int(const char* name, int64_t fallback, int64_t lo, int64_t hi, const char* what) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  BT_CHECK(end != v && *end == '\0' && errno == 0 && x >= lo && x <= hi, name, "='", v,
           "' is not an integer in [", lo, ", ", hi, "]: ", what);
  return static_cast<int64_t>(x);
}

}  // namespace bt
