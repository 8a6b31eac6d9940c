// BT_MPI_CHECK and BT_NCCL_CHECK turn real library errors into bt::Error with
// the call and file:line.
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

#ifdef BT_NCCL
TEST(DistChecks, NcclErrorBecomesBtError) {
  int count = 0;
  try {
    BT_NCCL_CHECK(ncclCommCount(nullptr, &count));  // invalid communicator
    FAIL() << "expected an NCCL error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("NCCL error"), std::string::npos) << m;
    EXPECT_NE(m.find("ncclCommCount"), std::string::npos) << m;
  }
}
#endif

}  // namespace
}  // namespace bt
