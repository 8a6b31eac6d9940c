// BT_NCCL_CHECK turns a real NCCL error into a bt::Error with the call (the
// MPI half: test_checks_mpi.cpp). NCCL is called without a GPU, so this runs
// in CI's main pass; a build without NCCL (the sanitizer pass, or a machine
// whose CUDA toolkit lacks it) reports the test as skipped, by name, so the
// log says whether it ran.
#include <gtest/gtest.h>

#include "runtime/dist/checks.h"

namespace bt {
namespace {

TEST(DistChecks, NcclErrorBecomesBtError) {
#ifdef BT_NCCL
  int count = 0;
  try {
    BT_NCCL_CHECK(ncclCommCount(nullptr, &count));  // invalid communicator
    FAIL() << "expected an NCCL error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("NCCL error"), std::string::npos) << m;
    EXPECT_NE(m.find("ncclCommCount"), std::string::npos) << m;
  }
#else
  GTEST_SKIP() << "built without NCCL (the configure line 'BluTrain: ... BT_NCCL=OFF')";
#endif
}

}  // namespace
}  // namespace bt
