// Writing a whole text file from the CLI (a resolved config, an sbatch
// script, manifests), with an error that names the file and says what to do.
#pragma once

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/common/error.h"

namespace bt::launcher {

/// Writes `text` to `path`; `what` names the file in the error ("the sbatch
/// script"). With `private_to_owner` the file is readable and writable by its
/// owner only (0600, set before the text goes in): for text holding a secret.
inline void write_text_file(const std::string& path, const std::string& text, const char* what,
                            bool private_to_owner = false) {
  if (private_to_owner) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    const bool ok = fd >= 0 && ::fchmod(fd, 0600) == 0;
    if (fd >= 0) ::close(fd);
    BT_CHECK(ok, "cannot write ", what, " '", path, "': ", std::strerror(errno),
             "; check that its folder exists and is writable");
  }
  std::ofstream f(path);
  BT_CHECK(f && (f << text) && f.flush(), "cannot write ", what, " '", path,
           "'; check that its folder exists and is writable");
}

}  // namespace bt::launcher
