// For fuzz targets whose parser reads files: the input written to a file in
// a folder of this process's own, rewritten for every input.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

namespace bt::fuzz {

/// This process's folder ($TMPDIR or /tmp, then bt_fuzz_PID), made once.
inline const std::string& folder() {
  static const std::string path = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string p = std::string(tmp && *tmp ? tmp : "/tmp") + "/bt_fuzz_" + std::to_string(::getpid());
    if (::mkdir(p.c_str(), 0700) != 0 && access(p.c_str(), W_OK) != 0) std::abort();
    return p;
  }();
  return path;
}

/// Writes `size` bytes to NAME in folder() and returns its path.
inline std::string write_input(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = folder() + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) std::abort();
  return path;
}

}  // namespace bt::fuzz
