// The TCP process group with 1 to 4 ranks as threads of one process (each its
// own store client and group, over real sockets on localhost): every
// collective against a reference computed locally (in the dtype, in rank
// order: bit for bit; and in float64: within rounding), the same bytes on
// every rank, in-place forms, sizes around the 1 MiB chunk, collectives that
// differ across ranks, a timeout that names the rank that did not arrive,
// ranks that disappear, and strangers at rank 0's port refused and named
// while the ranks connect (Note [Authenticated rendezvous]).
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/dist/auth.h"
#include "runtime/dist/tcp_process_group.h"
#include "runtime/dist/tcp_socket.h"
#include "runtime/dist/tcp_store.h"
#include "runtime/tensor/factory.h"
#include "tests/support/error_message.h"
#include "tests/support/stranger.h"

namespace bt::dist {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

const std::string kToken = auth::new_token();  // the job's (Note [Authenticated rendezvous])

/// Runs body(rank, group) on `n` ranks, each a thread with its own store
/// client and group; rethrows the first rank's failure.
void on_ranks(int n, const std::function<void(int, TcpProcessGroup&)>& body,
              milliseconds store_timeout = milliseconds(5000)) {
  TcpStore server("127.0.0.1", 0, true, store_timeout, kToken);  // rank 0's: it serves
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::unique_ptr<TcpStore> client;
        if (r > 0)
          client = std::make_unique<TcpStore>("127.0.0.1", server.port(), false, store_timeout, kToken);
        TcpProcessGroup pg(r == 0 ? server : *client, r, n);
        pg.set_timeout(milliseconds(20'000));
        body(r, pg);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

/// Rank r's input: values in [-1000, 1000] that fill f32's mantissa, so sums
/// round differently in different orders (whole numbers for integer dtypes,
/// 0..255 for u8).
Tensor input(DType dt, int64_t n, int rank, int salt) {
  Tensor f = empty({n}, TensorOptions{}.with_dtype(DType::F64));
  double* p = f.data<double>();
  const bool whole = dt == DType::I32 || dt == DType::I64 || dt == DType::U8 || dt == DType::Bool;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = (static_cast<uint64_t>(i) * 2654435761u + static_cast<uint64_t>(rank) * 40503u +
                        static_cast<uint64_t>(salt) * 977u) %
                       2048001u;
    p[i] = dt == DType::U8 ? static_cast<double>(h % 256)
           : whole         ? static_cast<double>(h % 2001) - 1000.0
                           : (static_cast<double>(h) - 1024000.5) / 1024.3;
  }
  return empty({n}, TensorOptions{}.with_dtype(dt)).copy_(f);
}

std::string bytes(const Tensor& t) { return std::string(static_cast<const char*>(t.data_ptr()), t.nbytes()); }

template <typename T>
void add_into(Tensor& acc, const Tensor& x) {
  T* a = acc.data<T>();
  const T* b = x.data<T>();
  for (int64_t i = 0; i < acc.numel(); ++i) a[i] = static_cast<T>(a[i] + b[i]);
}

/// The sum over ranks of input(dt, n, r, salt) in the dtype, in rank order
/// (what the group promises bit for bit), divided by the ranks for avg.
Tensor reference(DType dt, int64_t n, int ranks, int salt, ReduceOp op) {
  Tensor acc = input(dt, n, 0, salt);
  for (int r = 1; r < ranks; ++r) {
    const Tensor x = input(dt, n, r, salt);
    if (dt == DType::F32) add_into<float>(acc, x);
    if (dt == DType::F64) add_into<double>(acc, x);
    if (dt == DType::I32) add_into<int32_t>(acc, x);
    if (dt == DType::I64) add_into<int64_t>(acc, x);
  }
  if (op == ReduceOp::Avg && ranks > 1) acc.mul_(1.0 / ranks);
  return acc;
}

/// The same sum in float64, for a check that does not trust the order.
std::vector<double> reference_f64(DType dt, int64_t n, int ranks, int salt, ReduceOp op) {
  std::vector<double> s(static_cast<size_t>(n), 0.0);
  for (int r = 0; r < ranks; ++r) {
    const std::vector<double> x = input(dt, n, r, salt).to(DType::F64).to_vector<double>();
    for (size_t i = 0; i < s.size(); ++i) s[i] += x[i];
  }
  if (op == ReduceOp::Avg)
    for (double& v : s) v /= ranks;
  return s;
}

/// Every rank's result is `want`'s bytes, and within rounding of the float64
/// sum of `ranks` inputs (each at most 1000 in magnitude).
void expect_all(const std::vector<std::string>& got, const Tensor& want, const std::vector<double>& f64,
                int ranks, const std::string& what) {
  for (size_t r = 0; r < got.size(); ++r)
    ASSERT_TRUE(got[r] == bytes(want)) << what << ": rank " << r << " differs from the rank-order reference";
  const std::vector<double> w = want.to(DType::F64).to_vector<double>();
  const double eps = want.dtype() == DType::F32 ? 1.2e-7 : want.dtype() == DType::F64 ? 2.3e-16 : 0.0;
  size_t worst = 0;
  double err = 0;
  for (size_t i = 0; i < w.size(); ++i)
    if (std::fabs(w[i] - f64[i]) > err) err = std::fabs(w[i] - f64[i]), worst = i;
  EXPECT_LE(err, eps * 1000.0 * ranks * ranks)
      << what << " at " << worst << ": " << w[worst] << " vs " << f64[worst];
}

const int kRanks[] = {1, 2, 3, 4};
// 0, odd, one element past a whole number of ranks, and past two 1 MiB chunks of f32 (2 MiB + 12 bytes).
const int64_t kSizes[] = {0, 1, 7, 1001, (int64_t{1} << 19) + 3};

struct Case {
  DType dt;
  int64_t size;
  ReduceOp op = ReduceOp::Sum;
  bool in_place = false;
  int root = 0;
  std::string name() const {
    return cat(size, " ", dt, " ", reduce_op_name(op), in_place ? " in place" : "", " root ", root);
  }
};

/// Each rank runs every case in one group; got[case][rank] holds its result bytes.
std::vector<std::vector<std::string>> run_cases(
    int n, const std::vector<Case>& cases,
    const std::function<Tensor(int, TcpProcessGroup&, const Case&)>& run) {
  std::vector<std::vector<std::string>> got(cases.size(), std::vector<std::string>(static_cast<size_t>(n)));
  on_ranks(n, [&](int r, TcpProcessGroup& pg) {
    for (size_t k = 0; k < cases.size(); ++k) got[k][static_cast<size_t>(r)] = bytes(run(r, pg, cases[k]));
  });
  return got;
}

TEST(TcpProcessGroup, AllReduceMatchesTheReferenceBitForBitOnEveryRank) {
  std::vector<Case> cases;
  for (DType dt : {DType::F32, DType::F64, DType::I32, DType::I64})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg})
      for (int64_t size : kSizes) {
        const bool floating = dt == DType::F32 || dt == DType::F64;
        if ((op == ReduceOp::Sum || floating) && (size < 10'000 || dt == DType::F32))  // one multi-MiB dtype
          cases.push_back({dt, size, op});
      }
  for (int n : kRanks) {
    const auto got = run_cases(n, cases, [](int r, TcpProcessGroup& pg, const Case& c) {
      EXPECT_EQ(pg.backend(), "tcp");
      Tensor t = input(c.dt, c.size, r, 1);
      pg.all_reduce(t, c.op);
      return t;
    });
    for (size_t k = 0; k < cases.size(); ++k) {
      const Case& c = cases[k];
      expect_all(got[k], reference(c.dt, c.size, n, 1, c.op), reference_f64(c.dt, c.size, n, 1, c.op), n,
                 cat("all_reduce of ", c.name(), " on ", n, " ranks"));
    }
  }
}

TEST(TcpProcessGroup, ReduceScatterSeparateAndInPlace) {
  std::vector<Case> cases;
  for (DType dt : {DType::F32, DType::F64, DType::I64})
    for (int64_t slot :
         {int64_t{0}, int64_t{1}, int64_t{5}, (int64_t{1} << 18) + 3})  // the last: 1 MiB + 12 B of f32
      for (bool in_place : {false, true})
        if (slot < 10'000 || dt == DType::F32)
          cases.push_back({dt, slot, dt == DType::I64 ? ReduceOp::Sum : ReduceOp::Avg, in_place});
  for (int n : kRanks) {
    const auto got = run_cases(n, cases, [n](int r, TcpProcessGroup& pg, const Case& c) {
      Tensor in = input(c.dt, c.size * n, r, 2);
      Tensor out =
          c.in_place ? in.narrow(0, r * c.size, c.size) : empty({c.size}, TensorOptions{}.with_dtype(c.dt));
      pg.reduce_scatter(in, out, c.op);
      return out;
    });
    for (size_t k = 0; k < cases.size(); ++k) {
      const Case& c = cases[k];
      const Tensor sum = reference(c.dt, c.size * n, n, 2, c.op);
      const std::vector<double> f64 = reference_f64(c.dt, c.size * n, n, 2, c.op);
      for (int r = 0; r < n; ++r)
        expect_all({got[k][static_cast<size_t>(r)]}, sum.narrow(0, r * c.size, c.size).contiguous(),
                   std::vector<double>(f64.begin() + r * c.size, f64.begin() + (r + 1) * c.size), n,
                   cat("reduce_scatter of ", c.name(), " on ", n, " ranks, rank ", r));
    }
  }
}

TEST(TcpProcessGroup, AllGatherMovesEveryDtypeSeparateAndInPlace) {
  std::vector<Case> cases;
  for (DType dt : {DType::F32, DType::BF16, DType::I64, DType::U8, DType::Bool})
    for (int64_t slot : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{300'007}})
      for (bool in_place : {false, true})
        if (slot < 10'000 || dt == DType::F32 || dt == DType::BF16)
          cases.push_back({dt, slot, ReduceOp::Sum, in_place});
  for (int n : kRanks) {
    const auto got = run_cases(n, cases, [n](int r, TcpProcessGroup& pg, const Case& c) {
      Tensor out = zeros({c.size * n}, TensorOptions{}.with_dtype(c.dt));
      Tensor mine = input(c.dt, c.size, r, 3);
      if (c.in_place) {
        out.narrow(0, r * c.size, c.size).copy_(mine);
        mine = out.narrow(0, r * c.size, c.size);
      }
      pg.all_gather(mine, out);
      return out;
    });
    for (size_t k = 0; k < cases.size(); ++k) {
      std::string want;
      for (int r = 0; r < n; ++r) want += bytes(input(cases[k].dt, cases[k].size, r, 3));
      for (int r = 0; r < n; ++r)
        ASSERT_TRUE(got[k][static_cast<size_t>(r)] == want)
            << "all_gather of " << cases[k].name() << " on " << n << " ranks: rank " << r;
    }
  }
}

TEST(TcpProcessGroup, BroadcastFromEveryRootThenBarrier) {
  for (int n : kRanks) {
    std::vector<Case> cases;
    for (DType dt : {DType::F32, DType::BF16, DType::I32})
      for (int64_t size : {int64_t{1}, int64_t{1000}, (int64_t{1} << 19) + 1})
        for (int root = 0; root < n; ++root)
          if (size < 10'000 || dt == DType::F32) cases.push_back({dt, size, ReduceOp::Sum, false, root});
    const auto got = run_cases(n, cases, [](int r, TcpProcessGroup& pg, const Case& c) {
      Tensor t = input(c.dt, c.size, r, 4);
      pg.broadcast(t, c.root);
      pg.barrier();
      return t;
    });
    for (size_t k = 0; k < cases.size(); ++k)
      for (int r = 0; r < n; ++r)
        ASSERT_TRUE(got[k][static_cast<size_t>(r)] ==
                    bytes(input(cases[k].dt, cases[k].size, cases[k].root, 4)))
            << "broadcast of " << cases[k].name() << " on " << n << " ranks: rank " << r;
  }
}

TEST(TcpProcessGroup, AsyncWorkRunsInIssueOrderAndCanBeWaitedInAnyOrder) {
  on_ranks(3, [](int r, TcpProcessGroup& pg) {
    std::vector<Tensor> ts;
    std::vector<std::shared_ptr<Work>> ws;
    for (int k = 0; k < 6; ++k) {
      ts.push_back(full({100 + k}, r + k));
      ws.push_back(pg.all_reduce_async(ts.back(), ReduceOp::Sum));
    }
    Tensor all = zeros({3 * 5});
    ws.push_back(pg.all_gather_async(full({5}, 10.0 * r), all));
    for (auto it = ws.rbegin(); it != ws.rend(); ++it) (*it)->wait();
    for (int k = 0; k < 6; ++k) {
      EXPECT_TRUE(ws[static_cast<size_t>(k)]->done());
      EXPECT_EQ(ts[static_cast<size_t>(k)].to_vector<float>()[0], 3 + 3 * k);  // (0 + 1 + 2) + 3k
    }
    EXPECT_EQ(all.to_vector<float>()[14], 20.0f);
  });
}

TEST(TcpProcessGroup, BadArgumentsNameTheProblem) {
  on_ranks(2, [](int r, TcpProcessGroup& pg) {
    const auto msg = test::error_message;
    Tensor m = zeros({4, 6});
    EXPECT_NE(msg([&] { pg.all_reduce(m.t(), ReduceOp::Sum); }).find("not contiguous"), std::string::npos);
    EXPECT_NE(msg([&] { pg.all_gather(zeros({3}), zeros({7})); }).find("world size"), std::string::npos);
    EXPECT_NE(msg([&] {
                pg.all_reduce(zeros({2}, TensorOptions{}.with_dtype(DType::BF16)), ReduceOp::Sum);
              }).find("the tcp process group reduces f32, f64"),
              std::string::npos);
    EXPECT_NE(msg([&] {
                pg.all_reduce(zeros({2}, TensorOptions{}.with_dtype(DType::I32)), ReduceOp::Avg);
              }).find("avg"),
              std::string::npos);
    EXPECT_NE(msg([&] { pg.broadcast(zeros({2}), 2); }).find("root 2"), std::string::npos);
    EXPECT_NE(msg([&] { pg.all_reduce(Tensor(), ReduceOp::Sum); }).find("undefined"), std::string::npos);
    Tensor buf = zeros({4});
    EXPECT_NE(msg([&] { pg.all_gather(buf.narrow(0, (1 - r) * 2, 2), buf); }).find("slot of rank"),
              std::string::npos);
    pg.barrier();  // still in step: the errors came before any rank communicated
  });
}

TEST(TcpProcessGroup, CollectivesThatDifferAcrossRanksFailOnEveryRank) {
  std::vector<std::string> m(3);
  on_ranks(3, [&](int r, TcpProcessGroup& pg) {
    Tensor t = zeros({4});
    m[static_cast<size_t>(r)] = test::error_message([&] {
      if (r == 1)
        pg.broadcast(t, 0);
      else
        pg.all_reduce(t, ReduceOp::Sum);
    });
  });
  EXPECT_NE(m[0].find("collectives differ across ranks: rank 1 issued broadcast #1 of 16 bytes of f32 from "
                      "rank 0 while rank 0 issued all_reduce #1"),
            std::string::npos)
      << m[0];
  for (const std::string& s : m) EXPECT_NE(s.find("collectives differ across ranks"), std::string::npos) << s;
}

TEST(TcpProcessGroup, TimeoutNamesTheRankThatDidNotArrive) {
  for (const int late : {2, 0}) {
    std::atomic<int> timed_out{0};
    std::vector<std::string> m(3);
    on_ranks(3, [&](int r, TcpProcessGroup& pg) {
      Tensor t = full({3}, 1.0);
      pg.set_step(7);
      if (r == late) {
        while (timed_out.load() < 2) std::this_thread::sleep_for(milliseconds(5));
        pg.all_reduce(t, ReduceOp::Sum);
      } else {
        pg.set_timeout(milliseconds(300));
        auto w = pg.all_reduce_async(t, ReduceOp::Sum);
        const auto t0 = Clock::now();
        try {
          w->wait();
        } catch (const CollectiveTimeout& e) {
          m[static_cast<size_t>(r)] = e.what();
        }
        EXPECT_LT(Clock::now() - t0, milliseconds(2000)) << "the deadline was not kept";
        ++timed_out;
        // The late rank comes after all: the same Work completes on a second wait.
        pg.set_timeout(milliseconds(20'000));
        w->wait();
      }
      for (float x : t.to_vector<float>()) EXPECT_EQ(x, 3.0f);
    });
    for (int r = 0; r < 3; ++r) {
      if (r == late) continue;
      const std::string& s = m[static_cast<size_t>(r)];
      EXPECT_NE(s.find("all_reduce #1 (step 7) timed out after 0.3 s on rank " + std::to_string(r) + " of 3"),
                std::string::npos)
          << s;
      // Rank 0 knows every rank's arrival; the others know rank 0's.
      if (r == 0 || late == 0)
        EXPECT_NE(s.find("ranks that did not arrive: " + std::to_string(late) +
                         " (last collective reached: rank " + std::to_string(late) + " at #0)"),
                  std::string::npos)
            << s;
      else
        EXPECT_NE(s.find("rank 0 has arrived and waits for the others"), std::string::npos) << s;
    }
  }
}

// A rank whose group goes away: the others fail at once (with a deadline far
// away), naming it; later collectives fail with the same cause.
TEST(TcpProcessGroup, ARankThatDisappearsIsNamedAtOnce) {
  for (const bool mid_transfer : {false, true}) {
    std::vector<std::string> m(3), later(3);
    std::vector<double> seconds(3);
    std::atomic<bool> gone{false};
    const int64_t n = mid_transfer ? 8 << 20 : 4;  // 32 MiB: more than the sockets buffer
    on_ranks(3, [&](int r, TcpProcessGroup& pg) {
      if (r == 2) {
        // Mid-transfer: rank 2 starts sending, then its group is destroyed
        // while its worker is blocked on a full socket.
        std::shared_ptr<Work> w;
        if (mid_transfer) w = pg.all_reduce_async(zeros({n}), ReduceOp::Sum);
        std::this_thread::sleep_for(milliseconds(100));
        gone = true;
        return;  // the group is destroyed here, w abandoned
      }
      while (mid_transfer && !gone) std::this_thread::sleep_for(milliseconds(1));
      Tensor t = zeros({n});
      const auto t0 = Clock::now();
      m[static_cast<size_t>(r)] = test::error_message([&] { pg.all_reduce(t, ReduceOp::Sum); });
      seconds[static_cast<size_t>(r)] = std::chrono::duration<double>(Clock::now() - t0).count();
      later[static_cast<size_t>(r)] = test::error_message([&] { pg.barrier(); });
    });
    for (int r : {0, 1}) {
      const std::string& s = m[static_cast<size_t>(r)];
      EXPECT_NE(s.find("rank 2 disappeared during all_reduce #1"), std::string::npos) << s;
      EXPECT_LT(seconds[static_cast<size_t>(r)], 2.0) << "rank " << r << " noticed late: " << s;
      EXPECT_NE(later[static_cast<size_t>(r)].find("barrier #2 cannot run: "), std::string::npos)
          << later[static_cast<size_t>(r)];
      EXPECT_NE(later[static_cast<size_t>(r)].find("rank 2 disappeared"), std::string::npos)
          << later[static_cast<size_t>(r)];
    }
    EXPECT_NE(m[1].find("failed on rank 0: "), std::string::npos) << m[1];
  }
}

TEST(TcpProcessGroup, RankZeroThatDisappearsIsNamedAtOnce) {
  std::vector<std::string> m(3);
  on_ranks(3, [&](int r, TcpProcessGroup& pg) {
    if (r == 0) return;  // its group closes at once
    const auto t0 = Clock::now();
    m[static_cast<size_t>(r)] = test::error_message([&] { pg.barrier(); });
    EXPECT_LT(Clock::now() - t0, milliseconds(2000));
  });
  for (int r : {1, 2})
    EXPECT_NE(m[static_cast<size_t>(r)].find("rank 0 disappeared during barrier #1"), std::string::npos)
        << m[static_cast<size_t>(r)];
}

TEST(TcpProcessGroup, RanksThatNeverConnectAreNamed) {
  // Rank 2 of 3 never starts: rank 0 gives up after the store's timeout.
  TcpStore server("127.0.0.1", 0, true, milliseconds(400), kToken);
  std::string m;
  std::thread one([&] {
    TcpStore client("127.0.0.1", server.port(), false, milliseconds(400), kToken);
    TcpProcessGroup pg(client, 1, 3);
  });
  m = test::error_message([&] { TcpProcessGroup pg(server, 0, 3); });
  one.join();
  EXPECT_NE(m.find("tcp process group: rank(s) 2 did not connect to rank 0 at 127.0.0.1:"), std::string::npos)
      << m;
}

// Rank 0's group listens on a port of its own while the ranks connect: a
// stranger there with garbage, with another token, or with a proof recorded
// from another handshake (a replay) is refused and named in rank 0's log, and
// the ranks still make their group and reduce.
TEST(TcpProcessGroup, StrangersAtRankZerosPortAreRefusedAndTheGroupForms) {
  TcpStore server("127.0.0.1", 0, true, milliseconds(5000), kToken);
  const std::string recorded = test::recorded_proof(kToken);  // from another handshake
  testing::internal::CaptureStderr();
  std::vector<float> got(2);
  std::thread zero([&] {
    TcpProcessGroup pg(server, 0, 2);
    Tensor t = full({1}, 1.0);
    pg.all_reduce(t, ReduceOp::Sum);
    got[0] = t.item<float>();
  });
  TcpStore reader("127.0.0.1", server.port(), false, milliseconds(5000),
                  kToken);                               // a store client of its own
  const std::string addr = reader.get("tcp_pg/1/addr");  // where rank 0's group listens
  const int port = std::stoi(addr.substr(addr.rfind(':') + 1));
  test::as_stranger(port, [](int fd) {
    ASSERT_TRUE(net::send_all(fd, "BTPG garbage, not a handshake...", 32));
    ::shutdown(fd, SHUT_WR);
  });
  test::as_stranger(port, [](int fd) {
    std::string why;
    EXPECT_FALSE(auth::join(fd, auth::new_token(), milliseconds(3000), &why));
    EXPECT_NE(why.find("it refused this process's job token"), std::string::npos) << why;
  });
  test::as_stranger(port, [&](int fd) {
    char greeting[41];
    ASSERT_TRUE(net::recv_all(fd, greeting, sizeof greeting));
    ASSERT_TRUE(net::send_all(fd, recorded.data(), recorded.size()));
  });
  std::thread one([&] {
    TcpStore client("127.0.0.1", server.port(), false, milliseconds(5000), kToken);
    TcpProcessGroup pg(client, 1, 2);
    Tensor t = full({1}, 2.0);
    pg.all_reduce(t, ReduceOp::Sum);
    got[1] = t.item<float>();
  });
  one.join();
  zero.join();
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(got, (std::vector<float>{3.0f, 3.0f}));
  EXPECT_NE(log.find("tcp process group: rank 0 refused a connection from 127.0.0.1:"), std::string::npos)
      << log;
  EXPECT_NE(log.find("it sent 32 byte(s) and closed the connection: 'BTPG garbage"), std::string::npos)
      << log;
  EXPECT_NE(log.find("its proof of the job token is wrong (another token, or a replayed handshake)"),
            std::string::npos)
      << log;
  size_t wrong = 0;
  for (size_t at = log.find("proof of the job token is wrong"); at != std::string::npos;
       at = log.find("proof of the job token is wrong", at + 1))
    ++wrong;
  EXPECT_EQ(wrong, 2u) << "the other token and the replay: " << log;
}

}  // namespace
}  // namespace bt::dist
