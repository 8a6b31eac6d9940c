// Writing a whole text file from the CLI (a resolved config, an sbatch
// script, manifests), with an error that names the file and says what to do.
#pragma once

#include <fstream>
#include <string>

#include "kernels/common/error.h"

namespace bt::launcher {

/// Writes `text` to `path`; `what` names the file in the error ("the sbatch script").
inline void write_text_file(const std::string& path, const std::string& text, const char* what) {
  std::ofstream f(path);
  BT_CHECK(f && (f << text) && f.flush(), "cannot write ", what, " '", path,
           "'; check that its folder exists and is writable");
}

}  // namespace bt::launcher
