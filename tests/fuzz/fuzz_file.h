// For fuzz targets whose parser reads a file: the input written to a file of
// this process's own, rewritten for every input.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <unistd.h>

namespace bt::fuzz {

/// Writes the input to NAME in a folder of this process's ($TMPDIR or /tmp)
/// and returns its path.
inline const std::string& write_input(const char* name, const uint8_t* data, size_t size) {
  static const std::string path = [name] {
    const char* tmp = std::getenv("TMPDIR");
    return std::string(tmp && *tmp ? tmp : "/tmp") + "/bt_fuzz_" + std::to_string(::getpid()) + "_" + name;
  }();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) std::abort();
  return path;
}

}  // namespace bt::fuzz
