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

/// The device of test jobs: cpu (CI), or BT_TEST_DEVICE (cuda on the GPU
/// machine: the same jobs over NCCL, one GPU per rank).
std::string test_device();

/// Lets mpirun run as root (containers and CI do).
void allow_mpirun_as_root();
/// The prefix that runs a command on `np` oversubscribed local ranks with one
/// thread each (np 1: no mpirun, just the thread settings).
std::string mpirun_prefix(int np);

}  // namespace bt::test
