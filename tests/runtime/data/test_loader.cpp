// TokenLoader: window layout, ordering, rank sharding, epochs, resume, prefetch.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/common/error.h"
#include "runtime/data/loader.h"
#include "runtime/data/shard.h"
#include "tests/support/error_message.h"
#include "tests/support/temp_dir.h"

namespace bt {
namespace {

namespace fs = std::filesystem;

using Rows = std::vector<std::vector<int32_t>>;

class LoaderTest : public ::testing::Test {
 protected:
  // Shards whose tokens continue one counter (mod 65536) across shards.
  std::string write_shards(const std::vector<int64_t>& sizes, int64_t start = 0) {
    int64_t next = start;
    for (size_t s = 0; s < sizes.size(); ++s) {
      std::vector<uint16_t> tokens(static_cast<size_t>(sizes[s]));
      for (auto& t : tokens) t = static_cast<uint16_t>(next++ % 65536);
      char name[32];
      std::snprintf(name, sizeof(name), "shard_%03zu.bin", s);
      write_shard(tmp_.file(name), tokens);
    }
    return tmp_.file("shard_*.bin");
  }

  test::TempDir tmp_{"bt_loader_test"};
};

std::vector<int32_t> values(const Tensor& t) { return t.to_vector<int32_t>(); }

// Rows of inputs, each followed by its last target (the full T+1 window).
Rows windows(const Batch& b) {
  const int64_t B = b.inputs.size(0), T = b.inputs.size(1);
  const auto in = values(b.inputs), tg = values(b.targets);
  Rows rows;
  for (int64_t i = 0; i < B; ++i) {
    std::vector<int32_t> r(in.begin() + i * T, in.begin() + (i + 1) * T);
    r.push_back(tg[static_cast<size_t>((i + 1) * T - 1)]);
    rows.push_back(std::move(r));
  }
  return rows;
}

bool same(const Batch& a, const Batch& b) {
  return values(a.inputs) == values(b.inputs) && values(a.targets) == values(b.targets);
}

TEST_F(LoaderTest, TargetsAreInputsShiftedByOne) {
  // 70016 tokens (a multiple of T) cross the uint16 wrap at 65536.
  const std::string g = write_shards({70016, 5003});
  TokenLoader loader(g, 4, 64, 0, 1, 7);
  for (int step = 0; step < 50; ++step) {
    const Batch b = loader.next();
    const auto in = values(b.inputs), tg = values(b.targets);
    ASSERT_EQ(in.size(), 4u * 64);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(in[i * 64] % 64, 0) << "windows start at multiples of T";
      for (size_t t = 0; t < 64; ++t) {
        ASSERT_EQ(tg[i * 64 + t], (in[i * 64 + t] + 1) % 65536);
        if (t + 1 < 64) {
          ASSERT_EQ(in[i * 64 + t + 1], tg[i * 64 + t]);
        }
      }
    }
  }
}

TEST_F(LoaderTest, ReturnsPinnedI32Tensors) {
  TokenLoader loader(write_shards({1000}), 3, 16);
  const Batch b = loader.next();
  EXPECT_TRUE(b.inputs.is_pinned());
  EXPECT_TRUE(b.targets.is_pinned());
  EXPECT_EQ(b.inputs.dtype(), DType::I32);
  EXPECT_EQ(b.targets.dtype(), DType::I32);
  EXPECT_TRUE(b.inputs.device().is_cpu());
  EXPECT_EQ(b.inputs.shape(), (Shape{3, 16}));
  EXPECT_EQ(b.targets.shape(), (Shape{3, 16}));
}

TEST_F(LoaderTest, ShuffleOffIsSequential) {
  const std::string g = write_shards({100, 50});
  TokenLoader loader(g, 2, 8, 0, 1, 0, /*shuffle=*/false);
  // Shard 0 holds floor(99/8) = 12 windows, shard 1 floor(49/8) = 6 (its tokens start at 100).
  ASSERT_EQ(loader.num_samples(), 18);
  ASSERT_EQ(loader.batches_per_epoch(), 9);
  std::vector<int32_t> starts;
  for (int i = 0; i < 9; ++i)
    for (const auto& r : windows(loader.next())) starts.push_back(r[0]);
  std::vector<int32_t> expected;
  for (int k = 0; k < 12; ++k) expected.push_back(8 * k);
  for (int k = 0; k < 6; ++k) expected.push_back(100 + 8 * k);
  EXPECT_EQ(starts, expected);
}

TEST_F(LoaderTest, DeterministicForASeed) {
  const std::string g = write_shards({3000, 2000});
  TokenLoader a(g, 4, 32, 0, 1, 42), b(g, 4, 32, 0, 1, 42);
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(same(a.next(), b.next())) << i;
}

TEST_F(LoaderTest, DifferentSeedsGiveDifferentOrders) {
  const std::string g = write_shards({3000, 2000});
  TokenLoader a(g, 4, 32, 0, 1, 1), b(g, 4, 32, 0, 1, 2);
  int differing = 0;
  for (int i = 0; i < 10; ++i) differing += !same(a.next(), b.next());
  EXPECT_GT(differing, 0);
}

TEST_F(LoaderTest, RanksAreDisjointAndUnionIsTheWorldBatch) {
  const std::string g = write_shards({3000, 1777, 2500});
  TokenLoader r0(g, 3, 16, 0, 2, 9), r1(g, 3, 16, 1, 2, 9), whole(g, 6, 16, 0, 1, 9);
  ASSERT_EQ(r0.batches_per_epoch(), whole.batches_per_epoch());
  // Run past an epoch boundary too.
  for (int64_t step = 0; step < whole.batches_per_epoch() + 5; ++step) {
    const Rows a = windows(r0.next()), b = windows(r1.next()), w = windows(whole.next());
    std::set<int32_t> sa, sb;
    for (const auto& r : a) sa.insert(r[0]);
    for (const auto& r : b) sb.insert(r[0]);
    for (int32_t s : sa) EXPECT_EQ(sb.count(s), 0u) << "step " << step;
    Rows u = a;
    u.insert(u.end(), b.begin(), b.end());
    ASSERT_EQ(u, w) << "step " << step;
  }
}

TEST_F(LoaderTest, EpochWrapsAroundAndDropsTheTail) {
  // 3 shards x floor(199/8)=24 windows = 72 samples; B=5 -> 14 batches, 2 dropped.
  const std::string g = write_shards({200, 200, 200});
  TokenLoader loader(g, 5, 8, 0, 1, 3);
  ASSERT_EQ(loader.num_samples(), 72);
  ASSERT_EQ(loader.batches_per_epoch(), 14);
  std::vector<int32_t> epoch0, epoch1;
  for (int i = 0; i < 14; ++i)
    for (const auto& r : windows(loader.next())) epoch0.push_back(r[0]);
  const LoaderState s = loader.state();
  EXPECT_EQ(s.epoch, 1);
  EXPECT_EQ(s.position, 0);
  EXPECT_EQ(s.seed, 3u);
  for (int i = 0; i < 14; ++i)
    for (const auto& r : windows(loader.next())) epoch1.push_back(r[0]);
  EXPECT_EQ(loader.state().epoch, 2);
  EXPECT_EQ(std::set<int32_t>(epoch0.begin(), epoch0.end()).size(), 70u)
      << "no sample repeats within an epoch";
  EXPECT_EQ(std::set<int32_t>(epoch1.begin(), epoch1.end()).size(), 70u);
  EXPECT_NE(epoch0, epoch1) << "each epoch has its own order";
}

TEST_F(LoaderTest, StateCountsOnlyConsumedBatches) {
  TokenLoader loader(write_shards({5000}), 2, 16, 0, 1, 5);
  EXPECT_EQ(loader.state().position, 0);
  for (int i = 0; i < 3; ++i) loader.next();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let the prefetcher run ahead
  const LoaderState s = loader.state();
  EXPECT_EQ(s.epoch, 0);
  EXPECT_EQ(s.position, 3);
  EXPECT_EQ(s.seed, 5u);
}

TEST_F(LoaderTest, RestoreIsExactAfterPrefetchRanAhead) {
  const std::string g = write_shards({4000, 3000});
  TokenLoader loader(g, 3, 32, 0, 1, 11);
  for (int i = 0; i < 4; ++i) loader.next();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const LoaderState s = loader.state();
  std::vector<Batch> first;
  for (int i = 0; i < 5; ++i) first.push_back(loader.next());
  loader.restore(s);
  EXPECT_EQ(loader.state().position, s.position);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(same(first[static_cast<size_t>(i)], loader.next())) << i;

  // A fresh loader restored to s serves the same batches too.
  TokenLoader fresh(g, 3, 32, 0, 1, 999);
  fresh.restore(s);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(same(first[static_cast<size_t>(i)], fresh.next())) << i;
}

TEST_F(LoaderTest, RestoreOfCurrentStateContinuesIdentically) {
  const std::string g = write_shards({2000});
  TokenLoader a(g, 2, 16, 0, 1, 4), b(g, 2, 16, 0, 1, 4);
  const int64_t n = a.batches_per_epoch();
  for (int64_t i = 0; i < n - 2; ++i) {
    a.next();
    b.next();
  }
  b.restore(b.state());
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(same(a.next(), b.next())) << i;  // crosses the epoch boundary
}

TEST_F(LoaderTest, RestoreRejectsInvalidState) {
  TokenLoader loader(write_shards({1000}), 2, 16);
  const std::string msg = test::error_message([&] { loader.restore(LoaderState{0, 1000, 0}); });
  EXPECT_NE(msg.find("1000"), std::string::npos) << msg;
  loader.next();  // still usable
}

TEST_F(LoaderTest, DestructorWithFullQueueDoesNotHang) {
  // Note [A hang fails within the test's own bound]: the loaders are made and
  // destroyed on a thread of their own, and the test waits for it at most
  // kBound (these loaders take well under a second), so a destructor that
  // never wakes its worker fails here, naming the cause, instead of at
  // ctest's 600 s timeout. On timeout the thread is detached, not joined: it
  // is blocked for good, and joining it (or a std::async future's destructor)
  // would hang the test after all. Detached, it stays blocked until the
  // process exits, and the other tests of this executable still run.
  constexpr auto kBound = std::chrono::seconds(30);
  const std::string g = write_shards({5000});
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  std::thread churn([g, done] {  // captures by value: it may outlive this test
    try {
      for (int i = 0; i < 10; ++i) {
        TokenLoader loader(g, 4, 16);
        if (i % 2) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // queue fills
      }
      {
        TokenLoader loader(g, 4, 16);
        loader.next();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      done->set_value();
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  });
  if (finished.wait_for(kBound) != std::future_status::ready) {
    churn.detach();
    FAIL() << "making and destroying 11 TokenLoaders did not finish within " << kBound.count()
           << " s: ~TokenLoader must wake its prefetch worker (blocked on a full queue) and join it";
  }
  churn.join();
  EXPECT_NO_THROW(finished.get());
}

TEST_F(LoaderTest, WorkerErrorsAreRethrownFromNext) {
  const std::string g = write_shards({4000});
  const std::string shard = tmp_.file("shard_000.bin");
  TokenLoader loader(g, 4, 16, 0, 1, 0, /*shuffle=*/false);
  fs::resize_file(shard, 1024);  // truncated after the loader opened it
  std::string msg;
  for (int i = 0; i < 10 && msg.empty(); ++i) {
    try {
      loader.next();
    } catch (const Error& e) {
      msg = e.what();
    }
  }
  ASSERT_FALSE(msg.empty()) << "expected a bt::Error from next()";
  EXPECT_NE(msg.find(shard), std::string::npos) << msg;
  EXPECT_THROW(loader.next(), Error);  // the error persists
}

TEST_F(LoaderTest, BadArguments) {
  const std::string g = write_shards({1000});
  EXPECT_THROW(TokenLoader(g, 0, 16), Error);
  EXPECT_THROW(TokenLoader(g, 2, 0), Error);
  EXPECT_THROW(TokenLoader(g, -1, 16), Error);
  EXPECT_THROW(TokenLoader(g, 2, 16, 2, 2), Error);
  EXPECT_THROW(TokenLoader(g, 2, 16, -1, 2), Error);
  const std::string missing = tmp_.file("nope_*.bin");
  const std::string msg = test::error_message([&] { TokenLoader(missing, 2, 16); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
}

TEST_F(LoaderTest, TooLittleDataNamesTheTokenCounts) {
  // 2 shards x 50 tokens = 100 tokens; B*world*(T+1) = 4*2*17 = 136.
  const std::string g = write_shards({50, 50});
  const std::string msg = test::error_message([&] { TokenLoader(g, 4, 16, 0, 2); });
  EXPECT_NE(msg.find(g), std::string::npos) << msg;
  EXPECT_NE(msg.find("100 tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("136"), std::string::npos) << msg;
}

}  // namespace
}  // namespace bt
