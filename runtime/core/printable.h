// Bytes from outside -- a file name in a checkpoint index, what a stranger
// sent to a rendezvous port -- made safe to show in a message.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace bt {

/// `bytes` for a message: printable ASCII as is, every other byte as \xNN;
/// past the first `max` bytes, "..." stands for the rest.
inline std::string printable(std::string_view bytes, size_t max = std::string_view::npos) {
  std::string shown;
  for (size_t i = 0; i < bytes.size() && i < max; ++i) {
    const char c = bytes[i];
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned char>(c));
    shown += (c >= 32 && c < 127) ? std::string(1, c) : std::string(hex);
  }
  return bytes.size() > max ? shown + "..." : shown;
}

}  // namespace bt
