// Small file and shell helpers for tests that drive programs.
#pragma once

#include <string>

namespace bt::test {

/// The whole file as bytes ("" if it cannot be read).
std::string read_file(const std::string& path);
/// `s` quoted for a POSIX shell command line.
std::string shell_quote(const std::string& s);

}  // namespace bt::test
