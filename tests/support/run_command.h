// Runs a shell command for tests that drive the blutrain executable (or
// mpirun): its exit status and its stdout and stderr, merged.
#pragma once

#include <string>

namespace bt::test {

struct CommandResult {
  int status;       // the exit status; -1 if it did not exit normally
  std::string out;  // stdout and stderr, interleaved as written
};

CommandResult run_command(const std::string& cmd);

}  // namespace bt::test
