// main() of the *_mpi.cpp tests: the same executable runs as one process (MPI
// as a singleton) and under `mpirun -np N`. Rank 0 prints GoogleTest's usual
// output; other ranks print only their failures, tagged with the rank. The
// exit status is non-zero on every rank when any rank failed, and
// kSkipReturnCode when no rank failed or passed a test but some skipped one
// (a GPU test on a machine without enough GPUs): ctest then reports the entry
// as skipped (SKIP_RETURN_CODE in tests/CMakeLists.txt), not as passed.
#include <cstdio>

#include <gtest/gtest.h>
#include <mpi.h>

#include "runtime/dist/world.h"

namespace {

constexpr int kSkipReturnCode = 77;  // tests/CMakeLists.txt's SKIP_RETURN_CODE

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& t) override {
    if (t.result()->Failed())
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, t.test_suite_name(), t.name());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  }
  const bt::dist::World& w = bt::dist::init_world();
  if (w.rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(w.rank));
  }
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  // Every rank ends with the same status: any failure fails the run; else it
  // is skipped when no rank passed a test and some rank skipped one.
  const ::testing::UnitTest& u = *::testing::UnitTest::GetInstance();
  const int mine[3] = {failed, u.successful_test_count(), u.skipped_test_count()};
  int all[3] = {0, 0, 0};
  MPI_Allreduce(mine, all, 3, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (w.rank == 0 && all[0] && !failed)
    std::fprintf(stderr, "tests failed on another rank (see [rank N] lines)\n");
  const bool skipped = !all[0] && all[1] == 0 && all[2] > 0;
  if (w.rank == 0 && skipped)
    std::fprintf(stderr, "every test was skipped on every rank: exit status %d (ctest: skipped)\n",
                 kSkipReturnCode);
  bt::dist::finalize_world();
  return all[0] ? 1 : skipped ? kSkipReturnCode : 0;
}
