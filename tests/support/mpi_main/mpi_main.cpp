// main() of the *_mpi.cpp tests: the same executable runs as one process (MPI
// as a singleton) and under `mpirun -np N`. Rank 0 prints GoogleTest's usual
// output; other ranks print only their failures, tagged with the rank. The
// exit status is non-zero on every rank when any rank failed.
#include <cstdio>

#include <gtest/gtest.h>
#include <mpi.h>

#include "runtime/dist/world.h"

namespace {

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
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0, any = failed;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (w.rank == 0 && any && !failed)
    std::fprintf(stderr, "tests failed on another rank (see [rank N] lines)\n");
  bt::dist::finalize_world();
  return any;
}
