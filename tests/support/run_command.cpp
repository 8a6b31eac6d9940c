#include "tests/support/run_command.h"

#include <cstdio>
#include <cstdlib>

#include <sys/wait.h>

namespace bt::test {

CommandResult run_command(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed for: " + cmd};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

std::string test_device() {
  const char* d = std::getenv("BT_TEST_DEVICE");
  return d && *d ? d : "cpu";
}

void allow_mpirun_as_root() {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
}

std::string mpirun_prefix(int np) {
  // One thread per rank: the ranks share the machine's cores.
  const std::string threads = "BT_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ";
  if (np == 1) return threads;
  return threads + "mpirun -np " + std::to_string(np) +
         " --oversubscribe -x BT_NUM_THREADS -x OPENBLAS_NUM_THREADS ";
}

}  // namespace bt::test
