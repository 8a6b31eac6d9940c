// BT_MPI_CHECK turns a real MPI error into a bt::Error with the call and
// file:line (BT_NCCL_CHECK: test_checks_nccl.cpp).
#include <gtest/gtest.h>

#include "runtime/dist/checks.h"

namespace bt {
namespace {

TEST(DistChecks, MpiErrorBecomesBtError) {
  // tests/support/mpi_main initialized MPI, with MPI_ERRORS_RETURN on MPI_COMM_WORLD.
  int size = 0;
  BT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  int x = 0;
  try {
    BT_MPI_CHECK(MPI_Send(&x, 1, MPI_INT, size + 5, 0, MPI_COMM_WORLD));  // no such rank
    FAIL() << "expected an MPI error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("MPI error"), std::string::npos) << m;
    EXPECT_NE(m.find("MPI_Send"), std::string::npos) << m;
    EXPECT_NE(m.find("test_checks_mpi.cpp:"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace bt
