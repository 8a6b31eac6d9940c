// The MPI process group, run as 1, 2 and 4 real ranks: every collective's
// result against values computed locally, in-place forms, argument errors that
// name the problem, and a timeout that names the rank that did not arrive.
#include <chrono>
#include <numeric>
#include <thread>

#include <gtest/gtest.h>

#include "runtime/dist/mpi_process_group.h"
#include "runtime/dist/world.h"
#include "runtime/tensor/factory.h"
#include "tests/support/error_message.h"

namespace bt::dist {
namespace {

using std::chrono::milliseconds;

class MpiGroup : public ::testing::Test {
 protected:
  void SetUp() override {
    pg_ = cpu_group();
    pg_->set_timeout(milliseconds(60'000));
  }
  int rank() const { return pg_->rank(); }
  int size() const { return pg_->size(); }

  // [n] f32 on this rank: element i = (rank + 1) * (i + 1) + offset.
  Tensor ramp(int64_t n, double offset = 0, DType dt = DType::F32) const {
    Tensor t = empty({n}, TensorOptions{}.with_dtype(dt));
    Tensor f = empty({n}, TensorOptions{}.with_dtype(DType::F64));
    double* p = f.data<double>();
    for (int64_t i = 0; i < n; ++i) p[i] = (rank() + 1) * static_cast<double>(i + 1) + offset;
    return t.copy_(f);
  }
  // sum over ranks r of (r + 1) = N (N + 1) / 2
  double rank_sum() const { return size() * (size() + 1) / 2.0; }

  std::shared_ptr<ProcessGroup> pg_;
};

std::vector<double> as_f64(const Tensor& t) { return t.to(DType::F64).to_vector<double>(); }

TEST_F(MpiGroup, WorldComesFromMpi) {
  const World& w = world();
  EXPECT_TRUE(w.mpi);
  EXPECT_EQ(w.rank, rank());
  EXPECT_EQ(w.size, size());
  // mpirun -np N on one host: the shared-memory split holds every rank.
  EXPECT_EQ(w.local_size, w.size);
  EXPECT_EQ(w.local_rank, w.rank);
  EXPECT_EQ(pg_->backend(), "mpi");
}

TEST_F(MpiGroup, AllReduceSumAndAvg) {
  for (DType dt : {DType::F32, DType::F64}) {
    Tensor t = ramp(1000, 0, dt);
    pg_->all_reduce(t, ReduceOp::Sum);
    const std::vector<double> v = as_f64(t);
    for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(v[i], rank_sum() * (i + 1)) << dt << " at " << i;

    Tensor a = ramp(7, 0, dt);
    pg_->all_reduce(a, ReduceOp::Avg);
    const std::vector<double> av = as_f64(a);
    for (int64_t i = 0; i < 7; ++i) ASSERT_NEAR(av[i], rank_sum() * (i + 1) / size(), 1e-6 * (i + 1)) << dt;
  }
  Tensor ints = ramp(5, 0, DType::I64);
  pg_->all_reduce(ints, ReduceOp::Sum);
  EXPECT_EQ(ints.to_vector<int64_t>()[4], static_cast<int64_t>(rank_sum() * 5));
}

TEST_F(MpiGroup, AsyncWorkOverlapsAndCompletes) {
  std::vector<Tensor> ts;
  std::vector<std::shared_ptr<Work>> ws;
  for (int k = 0; k < 6; ++k) {
    ts.push_back(ramp(100 + k, k));
    ws.push_back(pg_->all_reduce_async(ts.back(), ReduceOp::Sum));
  }
  for (auto it = ws.rbegin(); it != ws.rend(); ++it) (*it)->wait();  // any order
  for (int k = 0; k < 6; ++k) {
    EXPECT_TRUE(ws[k]->done());
    EXPECT_EQ(as_f64(ts[k])[0], rank_sum() + size() * k);
  }
}

TEST_F(MpiGroup, ReduceScatterSeparateAndInPlace) {
  const int64_t n = 5;
  Tensor in = ramp(n * size());
  Tensor out = empty({n});
  pg_->reduce_scatter(in, out, ReduceOp::Sum);
  std::vector<double> v = as_f64(out);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(v[i], rank_sum() * (rank() * n + i + 1));

  Tensor buf = ramp(n * size());
  Tensor slot = buf.narrow(0, rank() * n, n);
  pg_->reduce_scatter(buf, slot, ReduceOp::Avg);
  v = as_f64(slot);
  for (int64_t i = 0; i < n; ++i) ASSERT_FLOAT_EQ(v[i], rank_sum() * (rank() * n + i + 1) / size());
}

TEST_F(MpiGroup, AllGatherSeparateAndInPlace) {
  const int64_t n = 3;
  Tensor in = full({n}, rank() + 0.5);
  Tensor out = zeros({n * size()});
  pg_->all_gather(in, out);
  std::vector<double> v = as_f64(out);
  for (int r = 0; r < size(); ++r)
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(v[r * n + i], r + 0.5);

  Tensor buf = full({n * size()}, -1.0);
  buf.narrow(0, rank() * n, n).fill_(10.0 * rank());
  pg_->all_gather(buf.narrow(0, rank() * n, n), buf);
  v = as_f64(buf);
  for (int r = 0; r < size(); ++r) ASSERT_EQ(v[r * n], 10.0 * r);

  // Moved, not reduced: bf16 goes through as 16-bit words.
  Tensor b = full({2}, rank() + 1.0, TensorOptions{}.with_dtype(DType::BF16));
  Tensor bo = empty({2 * size()}, TensorOptions{}.with_dtype(DType::BF16));
  pg_->all_gather(b, bo);
  EXPECT_EQ(as_f64(bo)[2 * size() - 1], size());
}

TEST_F(MpiGroup, BroadcastFromEveryRoot) {
  for (int root = 0; root < size(); ++root) {
    Tensor t = full({4}, rank() == root ? 42.0 + root : -1.0);
    pg_->broadcast(t, root);
    for (double x : as_f64(t)) ASSERT_EQ(x, 42.0 + root);
  }
  pg_->barrier();
}

TEST_F(MpiGroup, BadArgumentsNameTheProblem) {
  const auto msg = test::error_message;
  Tensor m = zeros({4, 6});
  EXPECT_NE(msg([&] { pg_->all_reduce(m.t(), ReduceOp::Sum); }).find("not contiguous"), std::string::npos);
  EXPECT_NE(msg([&] { pg_->all_gather(zeros({3}), zeros({3 * size() + 1})); }).find("world size"),
            std::string::npos);
  EXPECT_NE(msg([&] {
              pg_->all_reduce(zeros({2}, TensorOptions{}.with_dtype(DType::BF16)), ReduceOp::Sum);
            }).find("bf16"),
            std::string::npos);
  EXPECT_NE(msg([&] {
              pg_->all_reduce(zeros({2}, TensorOptions{}.with_dtype(DType::I32)), ReduceOp::Avg);
            }).find("avg"),
            std::string::npos);
  EXPECT_NE(msg([&] { pg_->broadcast(zeros({2}), size()); }).find("root"), std::string::npos);
  EXPECT_NE(msg([&] { pg_->all_reduce(Tensor(), ReduceOp::Sum); }).find("undefined"), std::string::npos);
  if (size() > 1) {
    Tensor buf = zeros({2 * size()});
    const int other = (rank() + 1) % size();
    EXPECT_NE(msg([&] { pg_->all_gather(buf.narrow(0, other * 2, 2), buf); }).find("slot of rank"),
              std::string::npos);
  }
  pg_->barrier();  // every rank is still in step: errors are raised before any rank communicates
}

TEST_F(MpiGroup, TimeoutNamesTheRankThatDidNotArrive) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  const int late = size() - 1;
  pg_->set_step(7);
  Tensor t = full({3}, 1.0);
  if (rank() != late) {
    pg_->set_timeout(milliseconds(800));
    auto w = pg_->all_reduce_async(t, ReduceOp::Sum);
    std::string m;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      w->wait();
    } catch (const CollectiveTimeout& e) {
      m = e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(2500)) << "the deadline was not kept";
    EXPECT_NE(m.find("all_reduce #"), std::string::npos) << m;
    EXPECT_NE(m.find("(step 7)"), std::string::npos) << m;
    EXPECT_NE(m.find("did not arrive: " + std::to_string(late) + " "), std::string::npos) << m;
    EXPECT_NE(m.find("on rank " + std::to_string(rank())), std::string::npos) << m;
    // The late rank comes after all: the same Work completes on a second wait.
    pg_->set_timeout(milliseconds(60'000));
    w->wait();
  } else {
    std::this_thread::sleep_for(milliseconds(2000));
    pg_->all_reduce(t, ReduceOp::Sum);
  }
  for (double x : as_f64(t)) EXPECT_EQ(x, size());
  pg_->set_step(0);
}

}  // namespace
}  // namespace bt::dist
