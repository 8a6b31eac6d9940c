#include "tests/support/paths.h"

namespace bt::test {

const std::string& source_dir() {
  static const std::string dir = BT_SOURCE_DIR;
  return dir;
}

const std::string& blutrain_exe() {
  static const std::string exe = BT_BLUTRAIN_EXE;
  return exe;
}

}  // namespace bt::test
