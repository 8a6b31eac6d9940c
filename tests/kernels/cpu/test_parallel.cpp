// parallel_for and the thread pool (kernels/cpu/parallel.h), the vectorized
// exp rows (kernels/cpu/exp_rows.h), and Note [Deterministic CPU parallelism]:
// the parallel kernels give the same bits for every thread count.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/common/philox.h"
#include "kernels/copy.h"
#include "kernels/cpu/exp_rows.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/random.h"
#include "kernels/reduce.h"
#include "kernels/scatter.h"
#include "kernels/softmax.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace bt::test {
namespace {
namespace cpu = kernels::cpu;
using kernels::StridedLayout;

/// Sets the pool size for a scope and restores the default after.
struct Threads {
  explicit Threads(int n) { cpu::set_num_threads(n); }
  ~Threads() { cpu::set_num_threads(0); }
};

const int kThreadCounts[] = {1, 2, 3, 8};

// ------------------------------------------------------------ parallel_for

TEST(ParallelFor, CoversEveryIndexOnceInGrainChunks) {
  struct Case {
    int64_t begin, end, grain;
  };
  const Case cases[] = {{0, 0, 1},   {5, 5, 3},    {7, 3, 2},     {0, 1, 1},        {0, 10, 1},
                        {0, 10, 3},  {-7, 9, 4},   {3, 1000, 7},  {0, 100, 0},      {0, 100, -5},
                        {0, 17, 17}, {0, 17, 100}, {1, 4097, 64}, {0, 100000, 1000}};
  for (int t : kThreadCounts) {
    Threads threads(t);
    ASSERT_EQ(cpu::num_threads(), t);
    for (const Case& c : cases) {
      SCOPED_TRACE(bt::cat("threads=", t, " [", c.begin, ", ", c.end, ") grain ", c.grain));
      const int64_t n = std::max<int64_t>(c.end - c.begin, 0), g = std::max<int64_t>(c.grain, 1);
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::mutex mu;
      std::set<std::pair<int64_t, int64_t>> chunks;
      cpu::parallel_for(c.begin, c.end, c.grain, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) hits[static_cast<size_t>(i - c.begin)]++;
        std::lock_guard<std::mutex> lk(mu);
        chunks.insert({lo, hi});
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "index " << i;
      // The chunks are exactly [begin + k g, min(end, begin + (k + 1) g)).
      ASSERT_EQ(static_cast<int64_t>(chunks.size()), cpu::num_chunks(c.begin, c.end, c.grain));
      int64_t k = 0;
      for (const auto& [lo, hi] : chunks) {
        EXPECT_EQ(lo, c.begin + k * g);
        EXPECT_EQ(hi, std::min(c.end, c.begin + (k + 1) * g));
        ++k;
      }
    }
  }
}

TEST(ParallelFor, UsesSeveralThreadsAndRunsInline) {
  {
    Threads threads(1);
    std::atomic<int> outside{0};
    const auto caller = std::this_thread::get_id();
    cpu::parallel_for(0, 64, 1, [&](int64_t, int64_t) {
      if (std::this_thread::get_id() != caller) outside++;
      EXPECT_TRUE(cpu::in_parallel_region());
    });
    EXPECT_EQ(outside.load(), 0) << "one thread must run every chunk on the caller";
  }
  EXPECT_FALSE(cpu::in_parallel_region());
  Threads threads(4);
  std::mutex mu;
  std::set<std::thread::id> ids;
  cpu::parallel_for(0, 400, 1, [&](int64_t, int64_t) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    std::lock_guard<std::mutex> lk(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_GT(ids.size(), 1u) << "400 sleeping chunks on a pool of 4 ran on one thread";
}

TEST(ParallelFor, RethrowsTheExceptionOfAChunk) {
  for (int t : kThreadCounts) {
    Threads threads(t);
    SCOPED_TRACE(bt::cat("threads=", t));
    expect_error(
        [] {
          cpu::parallel_for(0, 1000, 10, [](int64_t lo, int64_t) {
            if (lo == 500) BT_FAIL("chunk at ", lo, " failed");
          });
        },
        "chunk at 500 failed");
    // Every chunk throws: one exception reaches the caller.
    EXPECT_THROW(cpu::parallel_for(0, 100, 1, [](int64_t, int64_t) { throw std::runtime_error("x"); }),
                 std::runtime_error);
    // A one-chunk loop (inline) propagates as well.
    EXPECT_THROW(cpu::parallel_for(0, 5, 10, [](int64_t, int64_t) { throw std::logic_error("y"); }),
                 std::logic_error);
    // The pool still works after a failed loop.
    std::atomic<int64_t> sum{0};
    cpu::parallel_for(0, 1000, 7, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) sum += i;
    });
    EXPECT_EQ(sum.load(), 999 * 1000 / 2);
  }
}

TEST(ParallelFor, NestedLoopsRunInline) {
  for (int t : kThreadCounts) {
    Threads threads(t);
    std::vector<std::atomic<int>> hits(100 * 50);
    cpu::parallel_for(0, 100, 3, [&](int64_t lo, int64_t hi) {
      const auto outer_thread = std::this_thread::get_id();
      for (int64_t i = lo; i < hi; ++i)
        cpu::parallel_for(0, 50, 4, [&](int64_t lo2, int64_t hi2) {
          EXPECT_EQ(std::this_thread::get_id(), outer_thread);
          for (int64_t j = lo2; j < hi2; ++j) hits[static_cast<size_t>(i * 50 + j)]++;
        });
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    EXPECT_THROW(cpu::parallel_for(0, 10, 1, [](int64_t, int64_t) { cpu::set_num_threads(2); }), bt::Error);
  }
}

TEST(ParallelFor, LoopsFromSeveralOutsideThreads) {
  Threads threads(3);
  std::vector<std::thread> callers;
  std::atomic<int64_t> total{0};
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int rep = 0; rep < 50; ++rep)
        cpu::parallel_for(0, 1000, 10, [&](int64_t lo, int64_t hi) { total += hi - lo; });
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * 1000);
}

TEST(ParallelFor, ThreadCountFromTheEnvironment) {
  const char* old = std::getenv("BT_NUM_THREADS");
  const std::string saved = old ? old : "";
  ASSERT_EQ(setenv("BT_NUM_THREADS", "3", 1), 0);
  cpu::set_num_threads(0);
  EXPECT_EQ(cpu::num_threads(), 3);
  ASSERT_EQ(setenv("BT_NUM_THREADS", "zero", 1), 0);
  expect_error([] { cpu::set_num_threads(0); }, "BT_NUM_THREADS='zero'");
  ASSERT_EQ(unsetenv("BT_NUM_THREADS"), 0);
  cpu::set_num_threads(0);
  EXPECT_GE(cpu::num_threads(), 1);  // the CPUs of the affinity mask
  EXPECT_LE(cpu::num_threads(), static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  if (old) setenv("BT_NUM_THREADS", saved.c_str(), 1);
  cpu::set_num_threads(0);
}

TEST(ParallelFor, ChunkOrderReductionIsTheSameForEveryThreadCount) {
  const std::vector<double> xs = randn(100003, 7);
  auto sum = [&] {
    const int64_t grain = 1000, n = static_cast<int64_t>(xs.size());
    std::vector<float> part(static_cast<size_t>(cpu::num_chunks(0, n, grain)));
    cpu::parallel_for(0, n, grain, [&](int64_t lo, int64_t hi) {
      float s = 0;
      for (int64_t i = lo; i < hi; ++i) s += static_cast<float>(xs[static_cast<size_t>(i)]);
      part[static_cast<size_t>(lo / grain)] = s;
    });
    float s = 0;
    for (float p : part) s += p;
    return s;
  };
  float ref;
  {
    Threads threads(1);
    ref = sum();
  }
  for (int t : kThreadCounts) {
    Threads threads(t);
    for (int rep = 0; rep < 3; ++rep) EXPECT_EQ(sum(), ref);
  }
}

// ------------------------------------------------------------ exp rows

TEST(ExpRows, AccurateAndTheSameOnEveryInstructionSet) {
  using namespace kernels::cpu::detail;
  std::vector<float> x;
  for (double v : randn(5003, 11, 4.0)) x.push_back(static_cast<float>(v));
  x[3] = -INFINITY, x[4] = -1000.0f, x[5] = 80.0f, x[6] = -103.5f;
  const int64_t n = static_cast<int64_t>(x.size());
  const ExpIsa best = best_exp_isa();
  std::vector<std::vector<float>> outs;
  std::vector<double> sums;
  std::vector<float> maxs;
  for (ExpIsa isa : {ExpIsa::Generic, ExpIsa::Avx2, ExpIsa::Avx512}) {
    if (!set_exp_isa(isa)) continue;
    for (int64_t len : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, n}) {
      SCOPED_TRACE(bt::cat("isa ", static_cast<int>(isa), " len ", len));
      maxs.push_back(row_max(x.data(), len));
      sums.push_back(row_sum_exp(x.data(), len, 80.0));
      std::vector<float> out(static_cast<size_t>(len));
      row_exp_scale(x.data(), len, 2.0, 0.5, out.data());
      outs.push_back(out);
    }
  }
  ASSERT_TRUE(set_exp_isa(best));
  const size_t per = 5;
  ASSERT_GE(sums.size(), per);
  for (size_t i = per; i < sums.size(); ++i) {
    EXPECT_EQ(maxs[i], maxs[i % per]);
    EXPECT_EQ(sums[i], sums[i % per]) << "sum differs between instruction sets";
    EXPECT_EQ(outs[i], outs[i % per]) << "exp_scale differs between instruction sets";
  }
  // Against double exp: sums to 1e-11 relative, float outputs within half an ulp (+ a hair).
  double ref = 0;
  float mx = -INFINITY;
  for (float v : x) ref += std::exp(static_cast<double>(v) - 80.0), mx = std::max(mx, v);
  EXPECT_EQ(maxs[per - 1], mx);
  EXPECT_NEAR(sums[per - 1], ref, 1e-11 * ref);
  for (int64_t j = 0; j < n; ++j) {
    const double r = std::exp(static_cast<double>(x[j]) - 2.0) * 0.5;
    const float got = outs[per - 1][static_cast<size_t>(j)];
    const double ulp = std::nextafter(static_cast<float>(r), INFINITY) - static_cast<float>(r);
    if (r == 0 || !std::isfinite(r)) continue;
    ASSERT_LE(std::fabs(got - r), 0.5001 * ulp + 1e-45) << "x=" << x[j];
  }
  for (double v : {-700.0, -100.0, -1.0, -1e-9, 0.0, 1e-9, 0.5, 1.0, 10.0, 88.0, 700.0})
    EXPECT_NEAR(exp_d(v), std::exp(v), 1e-11 * std::exp(v)) << v;
  EXPECT_TRUE(std::isnan(exp_d(NAN)));
}

// ------------------------------------------------------------ kernels: same bits for every thread count

/// Runs `run` (which fills its outputs and returns them as bytes) once per
/// thread count and checks every run gives the bytes of the one-thread run.
void expect_same_bits(const std::function<std::vector<unsigned char>()>& run) {
  std::vector<unsigned char> ref;
  {
    Threads threads(1);
    ref = run();
  }
  for (int t : kThreadCounts) {
    Threads threads(t);
    SCOPED_TRACE(bt::cat("threads=", t));
    const std::vector<unsigned char> got = run();
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_TRUE(got == ref) << "results differ from BT_NUM_THREADS=1";
  }
  cpu::set_num_threads(0);
  EXPECT_TRUE(run() == ref) << "results with the default pool differ from BT_NUM_THREADS=1";
}

template <class... V>
std::vector<unsigned char> bytes_of(const V&... vs) {
  std::vector<unsigned char> out;
  auto add = [&](const auto& v) {
    const auto* p = reinterpret_cast<const unsigned char*>(v.data());
    out.insert(out.end(), p, p + v.size() * sizeof(*v.data()));
  };
  (add(vs), ...);
  return out;
}

TEST(ParallelKernels, CrossEntropyIsBitwiseDeterministic) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(name_of(dt));
    const int64_t rows = 300, vocab = 1001, ld = 1024;
    Buf logits = rand_buf(dt, static_cast<size_t>(rows * ld), 3, 3.0);
    std::vector<int32_t> tgt(rows);
    for (int64_t r = 0; r < rows; ++r) tgt[r] = r % 7 == 3 ? -1 : static_cast<int32_t>((r * 131) % vocab);
    const std::vector<double> dl = randn(rows, 4);
    std::vector<float> dloss(dl.begin(), dl.end());
    expect_same_bits([&] {
      kernels::CrossEntropyArgs a;
      a.dt = dt, a.logits = logits.data(), a.rows = rows, a.vocab = vocab, a.ld = ld, a.targets = tgt.data();
      std::vector<float> loss(rows), lse(rows);
      cpu::cross_entropy_forward(a, loss.data(), lse.data());
      Buf dx(dt, rows * ld);
      cpu::cross_entropy_backward(a, lse.data(), dloss.data(), dx.data());
      return bytes_of(loss, lse, dx.bytes);
    });
  }
}

TEST(ParallelKernels, LayerNormIsBitwiseDeterministicAndAccurate) {
  for (DType dt : kFloatTypes)
    for (int64_t cols : {int64_t{8}, int64_t{64}, int64_t{300}}) {
      SCOPED_TRACE(bt::cat(name_of(dt), " cols=", cols));
      const int64_t rows = 1500;  // several chunks of rows
      Buf x = rand_buf(dt, static_cast<size_t>(rows * cols), 5, 2.0), w = rand_buf(dt, cols, 6),
          b = rand_buf(dt, cols, 7), dy = rand_buf(dt, static_cast<size_t>(rows * cols), 8);
      std::vector<float> mean(rows), rstd(rows);
      Buf y(dt, rows * cols), dx(dt, rows * cols), dw(dt, cols), db(dt, cols);
      expect_same_bits([&] {
        cpu::layernorm_forward(dt, x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows,
                               cols, 1e-5f);
        cpu::layernorm_backward(dt, dy.data(), x.data(), w.data(), mean.data(), rstd.data(), dx.data(),
                                dw.data(), db.data(), rows, cols);
        return bytes_of(y.bytes, mean, rstd, dx.bytes, dw.bytes, db.bytes);
      });
      // The chunked dw/db sums against a double reference.
      const std::vector<double> xv = x.vals(), dyv = dy.vals();
      std::vector<double> rdw(cols, 0.0), rdb(cols, 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        double mu = 0, var = 0;
        for (int64_t j = 0; j < cols; ++j) mu += xv[r * cols + j];
        mu /= cols;
        for (int64_t j = 0; j < cols; ++j) var += (xv[r * cols + j] - mu) * (xv[r * cols + j] - mu);
        const double rs = 1.0 / std::sqrt(var / cols + 1e-5);
        for (int64_t j = 0; j < cols; ++j) {
          rdw[j] += dyv[r * cols + j] * (xv[r * cols + j] - mu) * rs;
          rdb[j] += dyv[r * cols + j];
        }
      }
      const double t = dt == DType::F64 ? 1e-7 : tol(dt);  // F64: rstd is float by contract
      EXPECT_LT(rel_err(dw.vals(), rdw), t);
      EXPECT_LT(rel_err(db.vals(), rdb), t);
    }
}

TEST(ParallelKernels, AttentionIsBitwiseDeterministic) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(name_of(dt));
    const kernels::AttnShape s{3, 2, 37, 8};
    const int64_t n = s.B * s.H * s.T * s.D;
    const auto st = kernels::contiguous_bhtd(s);
    Buf q = rand_buf(dt, n, 21), k = rand_buf(dt, n, 22), v = rand_buf(dt, n, 23), dout = rand_buf(dt, n, 24);
    expect_same_bits([&] {
      Buf o(dt, n), dq(dt, n), dk(dt, n), dv(dt, n);
      std::vector<float> lse(static_cast<size_t>(s.B * s.H * s.T));
      kernels::AttnForward f;
      f.dt = dt, f.shape = s, f.scale = 0.35f, f.q = q.data(), f.sq = st, f.k = k.data(), f.sk = st;
      f.v = v.data(), f.sv = st, f.o = o.data(), f.so = st, f.lse = lse.data();
      cpu::attention_forward(f);
      kernels::AttnBackward g;
      g.dt = dt, g.shape = s, g.scale = 0.35f, g.q = q.data(), g.sq = st, g.k = k.data(), g.sk = st;
      g.v = v.data(), g.sv = st, g.o = o.data(), g.so = st, g.dout = dout.data(), g.sdo = st;
      g.lse = lse.data(), g.dq = dq.data(), g.sdq = st, g.dk = dk.data(), g.sdk = st, g.dv = dv.data();
      g.sdv = st;
      cpu::attention_backward(g);
      return bytes_of(o.bytes, lse, dq.bytes, dk.bytes, dv.bytes);
    });
  }
}

TEST(ParallelKernels, ElementwiseRowwiseAndCopiesAreBitwiseDeterministic) {
  const int64_t rows = 257, cols = 300, n = rows * cols;
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(name_of(dt));
    Buf a = rand_buf(dt, n, 31), b = rand_buf(dt, cols, 32);
    std::vector<int32_t> idx(rows);
    for (int64_t i = 0; i < rows; ++i) idx[i] = static_cast<int32_t>((i * 37) % 200);
    expect_same_bits([&] {
      StridedLayout la, lb;  // a [rows, cols] + b broadcast over rows
      la.ndim = lb.ndim = 2;
      la.shape[0] = lb.shape[0] = rows, la.shape[1] = lb.shape[1] = cols;
      la.strides[0] = cols, la.strides[1] = 1, lb.strides[0] = 0, lb.strides[1] = 1;
      Buf add(dt, n), pw(dt, n), ex(dt, n), g(dt, n), gb(dt, n), sm(dt, n), lsm(dt, n), dsm(dt, n),
          red(dt, rows), red2(dt, cols), emb(dt, n), demb(dt, 200 * cols), tr(dt, n), sc(dt, n);
      cpu::binary(kernels::BinaryOp::Add, dt, a.data(), la, b.data(), lb, add.data());
      cpu::binary(kernels::BinaryOp::Pow, dt, a.data(), la, b.data(), lb, pw.data());
      cpu::unary(kernels::UnaryOp::Exp, dt, a.data(), ex.data(), n, 0.0);
      cpu::gelu_forward(dt, a.data(), g.data(), n);
      cpu::gelu_backward(dt, a.data(), add.data(), gb.data(), n);
      cpu::softmax_forward(dt, a.data(), sm.data(), rows, cols, false);
      cpu::softmax_forward(dt, a.data(), lsm.data(), rows, cols, true);
      cpu::softmax_backward(dt, sm.data(), add.data(), dsm.data(), rows, cols, false);
      cpu::reduce_dim(kernels::ReduceOp::Sum, dt, a.data(), red.data(), rows, cols, 1, nullptr);
      std::vector<int64_t> am(cols);
      cpu::reduce_dim(kernels::ReduceOp::Max, dt, a.data(), red2.data(), 1, rows, cols, am.data());
      cpu::embedding_forward(dt, a.data(), rows, cols, idx.data(), rows, emb.data());
      cpu::embedding_backward(dt, a.data(), idx.data(), rows, 200, cols, demb.data());
      StridedLayout lt;  // the transpose of a [rows, cols] buffer
      lt.ndim = 2, lt.shape[0] = cols, lt.shape[1] = rows, lt.strides[0] = 1, lt.strides[1] = cols;
      cpu::strided_copy(dt, a.data(), lt, dt, tr.data());
      cpu::strided_scatter(dt, tr.data(), sc.data(), lt);
      return bytes_of(add.bytes, pw.bytes, ex.bytes, g.bytes, gb.bytes, sm.bytes, lsm.bytes, dsm.bytes,
                      red.bytes, red2.bytes, am, emb.bytes, demb.bytes, tr.bytes, sc.bytes);
    });
  }
}

/// The fill kernels and AdamW match a plain serial evaluation bit for bit.
TEST(ParallelKernels, FillNormalAndAdamWAreUnchanged) {
  const int64_t n = 100003;
  for (int t : kThreadCounts) {
    Threads threads(t);
    SCOPED_TRACE(bt::cat("threads=", t));
    std::vector<float> x(n), u(n);
    cpu::fill_normal(DType::F32, x.data(), n, 1234, 77, 0.5f, 0.02f);
    cpu::fill_uniform(DType::F32, u.data(), n, 99, 5, -1.0f, 2.0f);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(x[i], kernels::philox::normal_at(1234, 77 + static_cast<uint64_t>(i), 0.5f, 0.02f)) << i;
      ASSERT_EQ(u[i], kernels::philox::uniform_at(99, 5 + static_cast<uint64_t>(i), -1.0f, 2.0f)) << i;
    }

    std::vector<float> p(x), m(n, 0.01f), v(n, 0.02f), grad(u), copy(n);
    kernels::AdamWArgs a;
    a.param = p.data(), a.grad = grad.data(), a.grad_dt = DType::F32, a.m = m.data(), a.v = v.data(), a.n = n;
    a.lr = 1e-3f, a.beta1 = 0.9f, a.beta2 = 0.95f, a.eps = 1e-8f, a.weight_decay = 0.1f;
    a.bias1 = 0.19f, a.bias2 = 0.0975f, a.grad_scale = 0.5f, a.param_copy = copy.data(),
    a.copy_dt = DType::F32;
    cpu::adamw(a);
    for (int64_t i = 0; i < n; ++i) {  // the formula of adamw.h, in float, serially
      const float g = grad[i] * a.grad_scale;
      const float mi = a.beta1 * 0.01f + (1.0f - a.beta1) * g;
      const float vi = a.beta2 * 0.02f + (1.0f - a.beta2) * (g * g);
      const float pi =
          x[i] - a.lr * (mi / a.bias1 / (std::sqrt(vi / a.bias2) + a.eps) + a.weight_decay * x[i]);
      ASSERT_EQ(m[i], mi) << i;
      ASSERT_EQ(v[i], vi) << i;
      ASSERT_EQ(p[i], pi) << i;
      ASSERT_EQ(copy[i], pi) << i;
    }
  }
}

}  // namespace
}  // namespace bt::test
