// CachingPool on the CPU, against a fake device: malloc-backed segments with a
// configurable capacity, and events whose completion the test controls.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/common/error.h"
#include "runtime/alloc/caching_pool.h"
#include "runtime/core/cuda_graph.h"

namespace bt {
namespace {

constexpr size_t KiB = size_t{1} << 10;
constexpr size_t MiB = size_t{1} << 20;
constexpr uintptr_t kS1 = 0x1000, kS2 = 0x2000, kS3 = 0x3000;

class FakeBacking : public BackingAllocator {
 public:
  explicit FakeBacking(size_t capacity = std::numeric_limits<size_t>::max()) : capacity(capacity) {}
  ~FakeBacking() override {
    for (auto& [p, n] : live) std::free(p);
  }

  void* raw_alloc(size_t n) override {
    if (n > capacity - used) return nullptr;
    void* p = std::malloc(n);
    if (p == nullptr) return nullptr;
    used += n;
    live[p] = n;
    ++raw_allocs;
    return p;
  }
  void raw_free(void* p) override {
    auto it = live.find(p);
    EXPECT_NE(it, live.end()) << "raw_free of a pointer the backing did not hand out";
    if (it == live.end()) return;
    used -= it->second;
    live.erase(it);
    std::free(p);
    ++raw_frees;
  }
  uint64_t record_event(uintptr_t stream) override {
    events[next_event] = Event{stream, false};
    return next_event++;
  }
  bool event_done(uint64_t ev) override {
    ++event_queries;
    auto it = events.find(ev);
    EXPECT_NE(it, events.end()) << "event_done on a released event";
    return it == events.end() || it->second.done;
  }
  void release_event(uint64_t ev) override { EXPECT_EQ(events.erase(ev), 1u) << "release_event twice"; }
  void synchronize() override {
    ++syncs;
    complete_all();
  }
  std::string name() const override { return "fake:0"; }
  bool memory_info(size_t* free_bytes, size_t* total_bytes) override {
    if (capacity == std::numeric_limits<size_t>::max()) return false;
    *free_bytes = capacity - used;
    *total_bytes = capacity;
    return true;
  }

  // Test controls.
  void complete_stream(uintptr_t s) {
    for (auto& [id, e] : events)
      if (e.stream == s) e.done = true;
  }
  void complete_all() {
    for (auto& [id, e] : events) e.done = true;
  }
  // True when event `id` has completed (a released event has completed).
  bool done(uint64_t id) const {
    auto it = events.find(id);
    return it == events.end() || it->second.done;
  }

  struct Event {
    uintptr_t stream;
    bool done;
  };
  size_t capacity;
  size_t used = 0;
  std::map<void*, size_t> live;
  std::map<uint64_t, Event> events;
  uint64_t next_event = 1;
  int raw_allocs = 0, raw_frees = 0, syncs = 0, event_queries = 0;
};

char* as_bytes(void* p) { return static_cast<char*>(p); }

TEST(CachingPool, FreedBlockIsReusedWithoutBackingMalloc) {
  FakeBacking backing;
  CachingPool pool(backing);
  void* p = pool.allocate(1000, kS1);
  pool.deallocate(p);
  void* q = pool.allocate(1000, kS1);
  EXPECT_EQ(q, p);
  EXPECT_EQ(backing.raw_allocs, 1);
  EXPECT_EQ(pool.stats().num_backing_mallocs, 1u);
  EXPECT_EQ(pool.stats().num_allocs, 2u);
  pool.deallocate(q);
}

TEST(CachingPool, SizesAreRounded) {
  EXPECT_EQ(CachingPool::round_size(0), 512u);
  EXPECT_EQ(CachingPool::round_size(1), 512u);
  EXPECT_EQ(CachingPool::round_size(512), 512u);
  EXPECT_EQ(CachingPool::round_size(513), 1024u);
  EXPECT_EQ(CachingPool::round_size(3 * MiB + 1), 3 * MiB + 512);
  EXPECT_EQ(CachingPool::segment_size(512), 2 * MiB);
  EXPECT_EQ(CachingPool::segment_size(MiB), 2 * MiB);
  EXPECT_EQ(CachingPool::segment_size(MiB + 512), 20 * MiB);
  EXPECT_EQ(CachingPool::segment_size(10 * MiB - 512), 20 * MiB);
  EXPECT_EQ(CachingPool::segment_size(10 * MiB), 10 * MiB);
  EXPECT_EQ(CachingPool::segment_size(10 * MiB + 512), 12 * MiB);

  FakeBacking backing;
  CachingPool pool(backing);
  void* a = pool.allocate(0, kS1);
  void* b = pool.allocate(1, kS1);
  void* c = pool.allocate(1000, kS1);
  EXPECT_NE(a, nullptr);
  EXPECT_NE(a, b);
  EXPECT_EQ(pool.block_size(a), 512u);
  EXPECT_EQ(pool.block_size(b), 512u);
  EXPECT_EQ(pool.block_size(c), 1024u);
  EXPECT_EQ(pool.stats().allocated, 2048u);
  EXPECT_EQ(as_bytes(b) - as_bytes(a), 512);  // carved one after another
  EXPECT_EQ(as_bytes(c) - as_bytes(b), 512);
  for (void* p : {a, b, c}) pool.deallocate(p);
  EXPECT_EQ(pool.stats().allocated, 0u);
}

TEST(CachingPool, SmallAndLargePoolsAreSeparate) {
  FakeBacking backing;
  CachingPool pool(backing);
  void* s = pool.allocate(4 * KiB, kS1);
  pool.deallocate(s);                       // the 2 MiB small segment is now entirely free
  void* l = pool.allocate(MiB + 512, kS1);  // large: must not come from the small segment
  EXPECT_EQ(backing.raw_allocs, 2);
  EXPECT_TRUE(as_bytes(l) < as_bytes(s) || as_bytes(l) >= as_bytes(s) + 2 * MiB);
  pool.deallocate(l);
  void* s2 = pool.allocate(MiB, kS1);  // the largest small request fits the small segment
  EXPECT_EQ(s2, s);
  EXPECT_EQ(backing.raw_allocs, 2);

  auto segs = pool.snapshot();
  ASSERT_EQ(segs.size(), 2u);
  int small = 0, large = 0;
  for (auto& seg : segs) {
    if (seg.small) {
      ++small;
      EXPECT_EQ(seg.size, 2 * MiB);
    } else {
      ++large;
      EXPECT_EQ(seg.size, 20 * MiB);
    }
  }
  EXPECT_EQ(small, 1);
  EXPECT_EQ(large, 1);
  pool.deallocate(s2);
}

TEST(CachingPool, SplitsSegmentsIntoBlocks) {
  FakeBacking backing;
  CachingPool pool(backing);
  void* a = pool.allocate(1000, kS1);
  void* b = pool.allocate(3000, kS1);
  EXPECT_EQ(backing.raw_allocs, 1);  // both from one 2 MiB segment
  EXPECT_EQ(as_bytes(b), as_bytes(a) + 1024);
  auto segs = pool.snapshot();
  ASSERT_EQ(segs.size(), 1u);
  ASSERT_EQ(segs[0].blocks.size(), 3u);
  EXPECT_EQ(segs[0].blocks[0].size, 1024u);
  EXPECT_EQ(segs[0].blocks[0].state, CachingPool::BlockState::kLive);
  EXPECT_EQ(segs[0].blocks[1].size, 3072u);
  EXPECT_EQ(segs[0].blocks[2].size, 2 * MiB - 4096);
  EXPECT_EQ(segs[0].blocks[2].state, CachingPool::BlockState::kFree);

  // Large pool: a remainder of <= 1 MiB is not split off.
  void* l = pool.allocate(12 * MiB - 512, kS1);  // 12 MiB segment, 512 B left over
  EXPECT_EQ(pool.block_size(l), 12 * MiB);
  void* m = pool.allocate(2 * MiB, kS1);  // 20 MiB segment, 18 MiB left over: split
  EXPECT_EQ(pool.block_size(m), 2 * MiB);
  void* n = pool.allocate(2 * MiB, kS1);
  EXPECT_EQ(as_bytes(n), as_bytes(m) + 2 * MiB);
  EXPECT_EQ(backing.raw_allocs, 3);
  for (void* p : {a, b, l, m, n}) pool.deallocate(p);
}

TEST(CachingPool, FreeNeighboursCoalesce) {
  FakeBacking backing;
  CachingPool pool(backing);
  void* a = pool.allocate(512 * KiB, kS1);
  void* b = pool.allocate(512 * KiB, kS1);
  void* c = pool.allocate(512 * KiB, kS1);
  void* d = pool.allocate(512 * KiB, kS1);  // the 2 MiB segment is full
  EXPECT_EQ(backing.raw_allocs, 1);
  pool.deallocate(b);
  pool.deallocate(a);                 // merges with b
  void* e = pool.allocate(MiB, kS1);  // fits only in the merged a+b
  EXPECT_EQ(e, a);
  EXPECT_EQ(backing.raw_allocs, 1);
  pool.deallocate(c);
  pool.deallocate(e);
  pool.deallocate(d);
  auto segs = pool.snapshot();
  ASSERT_EQ(segs.size(), 1u);
  ASSERT_EQ(segs[0].blocks.size(), 1u);  // one free block again
  EXPECT_EQ(segs[0].blocks[0].size, 2 * MiB);
  EXPECT_EQ(segs[0].blocks[0].state, CachingPool::BlockState::kFree);
}

TEST(CachingPool, BlocksAreNotSharedAcrossStreams) {
  FakeBacking backing;
  CachingPool pool(backing);
  void* p = pool.allocate(1000, kS1);
  pool.deallocate(p);
  void* q = pool.allocate(1000, kS2);
  EXPECT_TRUE(as_bytes(q) < as_bytes(p) || as_bytes(q) >= as_bytes(p) + 2 * MiB);
  EXPECT_EQ(backing.raw_allocs, 2);
  void* r = pool.allocate(1000, kS1);
  EXPECT_EQ(r, p);
  for (auto& seg : pool.snapshot()) {
    const bool has_p = seg.addr == reinterpret_cast<uintptr_t>(p);
    EXPECT_EQ(seg.stream, has_p ? kS1 : kS2);
  }
  pool.deallocate(q);
  pool.deallocate(r);
}

TEST(CachingPool, RecordStreamDefersReuseUntilEventsComplete) {
  FakeBacking backing;
  CachingPool pool(backing);
  void* p = pool.allocate(1000, kS1);
  pool.record_stream(p, kS1);  // its own stream: no event needed
  pool.record_stream(p, kS2);
  pool.record_stream(p, kS3);
  pool.record_stream(p, kS2);  // duplicates count once
  pool.deallocate(p);
  EXPECT_EQ(backing.events.size(), 2u);
  EXPECT_EQ(pool.stats().allocated, 0u);

  void* q = pool.allocate(1000, kS1);
  EXPECT_NE(q, p);  // p is still in use by S2 and S3
  backing.complete_stream(kS2);
  void* r = pool.allocate(1000, kS1);
  EXPECT_NE(r, p);                       // S3 still pending
  EXPECT_EQ(backing.events.size(), 1u);  // S2's event was released
  backing.complete_stream(kS3);
  void* s = pool.allocate(1000, kS1);
  EXPECT_EQ(s, p);
  EXPECT_TRUE(backing.events.empty());
  EXPECT_EQ(backing.raw_allocs, 1);
  for (void* x : {q, r, s}) pool.deallocate(x);
}

TEST(CachingPool, PlainFreeIsReusableAtOnceOnItsStream) {
  FakeBacking backing;
  CachingPool pool(backing);
  void* p = pool.allocate(5 * MiB, kS2);
  pool.deallocate(p);
  EXPECT_TRUE(backing.events.empty());
  EXPECT_EQ(pool.allocate(5 * MiB, kS2), p);
  pool.deallocate(p);
}

TEST(CachingPool, OomFlushesCachedSegmentsAndRetries) {
  FakeBacking backing(22 * MiB);
  CachingPool pool(backing);
  void* a = pool.allocate(12 * MiB, kS1);
  pool.deallocate(a);  // cached, but only for S1
  void* b = pool.allocate(12 * MiB, kS2);
  EXPECT_NE(b, nullptr);
  auto st = pool.stats();
  EXPECT_EQ(st.num_oom_retries, 1u);
  EXPECT_EQ(st.num_backing_mallocs, 2u);
  EXPECT_EQ(st.num_backing_frees, 1u);
  EXPECT_EQ(st.reserved, 12 * MiB);
  EXPECT_EQ(backing.syncs, 1);  // synchronized before freeing
  pool.deallocate(b);
}

TEST(CachingPool, OomFirstWaitsForPendingEvents) {
  FakeBacking backing(14 * MiB);
  CachingPool pool(backing);
  void* a = pool.allocate(12 * MiB, kS1);
  pool.record_stream(a, kS2);
  pool.deallocate(a);
  void* b = pool.allocate(12 * MiB, kS1);  // OOM -> synchronize -> a's event done -> reuse
  EXPECT_EQ(b, a);
  EXPECT_EQ(pool.stats().num_oom_retries, 0u);
  EXPECT_EQ(backing.syncs, 1);
  EXPECT_TRUE(backing.events.empty());
  pool.deallocate(b);
}

TEST(CachingPool, OomFallsBackToExactSegment) {
  FakeBacking backing(8 * MiB);
  CachingPool pool(backing);
  void* a = pool.allocate(3 * MiB, kS1);  // wants a 20 MiB segment; 4 MiB fits
  EXPECT_EQ(pool.stats().reserved, 4 * MiB);
  EXPECT_EQ(pool.stats().num_oom_retries, 1u);
  pool.deallocate(a);
}

TEST(CachingPool, OomThatStillFailsThrowsAClearError) {
  FakeBacking backing(22 * MiB);
  CachingPool pool(backing);
  void* a = pool.allocate(12 * MiB, kS1);
  const size_t request = 12 * MiB + 7;
  try {
    pool.allocate(request, kS1);
    FAIL() << "expected bt::Error";
  } catch (const InternalError& e) {
    FAIL() << "OOM must be a user-facing bt::Error, not an internal error: " << e.what();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory on fake:0"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(request)), std::string::npos) << msg;  // requested size
    EXPECT_NE(msg.find("12.00 MiB"), std::string::npos) << msg;              // allocated / reserved
    EXPECT_NE(msg.find("22.00 MiB"), std::string::npos) << msg;              // capacity
    EXPECT_NE(msg.find("batch size"), std::string::npos) << msg;
    EXPECT_NE(msg.find("activation checkpointing"), std::string::npos) << msg;
  }
  EXPECT_EQ(pool.stats().num_oom_retries, 1u);
  EXPECT_EQ(pool.stats().allocated, 12 * MiB);
  // The pool is still usable.
  pool.deallocate(a);
  void* b = pool.allocate(request, kS1);          // flushes a's 12 MiB segment, takes a 14 MiB one
  EXPECT_EQ(pool.block_size(b), 12 * MiB + 512);  // 2 MiB - 512 B left over: split off
  EXPECT_EQ(pool.stats().num_oom_retries, 2u);
  pool.deallocate(b);
  EXPECT_THROW(pool.allocate(std::numeric_limits<size_t>::max(), kS1), Error);
}

TEST(CachingPool, EmptyCacheReleasesOnlyEntirelyFreeSegments) {
  FakeBacking backing;
  CachingPool pool(backing);
  void* a = pool.allocate(1000, kS1);      // small segment, stays live
  void* a2 = pool.allocate(1000, kS1);     // same segment
  void* b = pool.allocate(12 * MiB, kS1);  // large segment, freed
  void* c = pool.allocate(1000, kS2);      // small segment of S2, freed
  void* d = pool.allocate(2 * MiB, kS1);   // 20 MiB segment, pending on an event
  pool.deallocate(a2);
  pool.deallocate(b);
  pool.deallocate(c);
  pool.record_stream(d, kS3);
  pool.deallocate(d);
  EXPECT_EQ(pool.stats().reserved, 2 * MiB + 12 * MiB + 2 * MiB + 20 * MiB);
  pool.empty_cache();  // synchronizes for d's event, then releases b's, c's, d's segments
  auto st = pool.stats();
  EXPECT_EQ(st.reserved, 2 * MiB);
  EXPECT_EQ(st.num_backing_frees, 3u);
  EXPECT_EQ(backing.raw_frees, 3);
  EXPECT_EQ(backing.used, 2 * MiB);
  EXPECT_TRUE(backing.events.empty());
  pool.deallocate(a);
  pool.empty_cache();
  EXPECT_EQ(pool.stats().reserved, 0u);
  EXPECT_TRUE(backing.live.empty());
  EXPECT_TRUE(pool.snapshot().empty());
}

TEST(CachingPool, Statistics) {
  FakeBacking backing;
  CachingPool pool(backing);
  void* a = pool.allocate(1000, kS1);      // 1024 B block, 2 MiB segment
  void* b = pool.allocate(12 * MiB, kS1);  // 12 MiB segment
  auto st = pool.stats();
  EXPECT_EQ(st.allocated, 1024 + 12 * MiB);
  EXPECT_EQ(st.reserved, 14 * MiB);
  EXPECT_EQ(st.peak_allocated, st.allocated);
  EXPECT_EQ(st.peak_reserved, 14 * MiB);
  EXPECT_EQ(st.num_allocs, 2u);
  EXPECT_EQ(st.num_backing_mallocs, 2u);
  pool.deallocate(b);
  st = pool.stats();
  EXPECT_EQ(st.allocated, 1024u);
  EXPECT_EQ(st.reserved, 14 * MiB);  // cached
  EXPECT_EQ(st.peak_allocated, 1024 + 12 * MiB);
  pool.reset_peak();
  st = pool.stats();
  EXPECT_EQ(st.peak_allocated, 1024u);
  EXPECT_EQ(st.peak_reserved, 14 * MiB);
  pool.empty_cache();
  pool.reset_peak();
  st = pool.stats();
  EXPECT_EQ(st.reserved, 2 * MiB);
  EXPECT_EQ(st.peak_reserved, 2 * MiB);
  EXPECT_EQ(st.num_backing_frees, 1u);
  EXPECT_EQ(st.num_oom_retries, 0u);
  void* c = pool.allocate(4096, kS1);
  EXPECT_EQ(pool.stats().peak_allocated, 1024u + 4096u);
  pool.deallocate(a);
  pool.deallocate(c);
}

TEST(CachingPool, UnknownPointerIsAnInternalError) {
  FakeBacking backing;
  CachingPool pool(backing);
  int x = 0;
  EXPECT_THROW(pool.deallocate(&x), InternalError);
  EXPECT_THROW(pool.record_stream(&x, kS2), InternalError);
  void* p = pool.allocate(100, kS1);
  EXPECT_THROW(pool.deallocate(as_bytes(p) + 512), InternalError);  // inside a block, not its start
  pool.deallocate(p);
  EXPECT_THROW(pool.deallocate(p), InternalError);  // double free
  pool.deallocate(nullptr);                         // no-op
}

TEST(CachingPool, DestructorReturnsAllSegments) {
  FakeBacking backing;
  {
    CachingPool pool(backing);
    void* p = pool.allocate(100, kS1);
    pool.record_stream(p, kS2);
    pool.deallocate(p);                             // pending
    pool.deallocate(pool.allocate(30 * MiB, kS2));  // cached
    (void)pool.allocate(5 * MiB, kS3);              // still live at destruction
  }
  EXPECT_TRUE(backing.live.empty());
  EXPECT_TRUE(backing.events.empty());
  EXPECT_EQ(backing.raw_frees, 3);
}

TEST(CachingPool, ConcurrentThreads) {
  FakeBacking backing;
  CachingPool pool(backing);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, t] {
      std::mt19937 rng(t);
      std::vector<void*> mine;
      const uintptr_t stream = kS1 * (1 + t % 3);
      for (int i = 0; i < 2000; ++i) {
        if (mine.empty() || rng() % 2 == 0) {
          const size_t n = 1 + rng() % (rng() % 8 == 0 ? 8 * MiB : 64 * KiB);
          void* p = pool.allocate(n, stream);
          std::memset(p, t, std::min<size_t>(n, 64));
          mine.push_back(p);
        } else {
          const size_t k = rng() % mine.size();
          EXPECT_EQ(*as_bytes(mine[k]), static_cast<char>(t));
          pool.deallocate(mine[k]);
          mine[k] = mine.back();
          mine.pop_back();
        }
      }
      for (void* p : mine) pool.deallocate(p);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(pool.stats().allocated, 0u);
  pool.empty_cache();
  EXPECT_EQ(pool.stats().reserved, 0u);
}

// ------------------------------------------------------------------ stress

struct Live {
  uintptr_t addr;
  size_t rounded;  // round_size of the request
  uintptr_t stream;
  std::vector<uintptr_t> uses;  // record_stream'd streams
  unsigned char tag;
};
struct InFlight {  // freed, but work on other streams may still use it
  uintptr_t addr;
  size_t size;
  std::vector<uint64_t> events;
};

bool overlaps(uintptr_t a, size_t an, uintptr_t b, size_t bn) { return a < b + bn && b < a + an; }

class Stress {
 public:
  explicit Stress(uint64_t seed) : rng_(seed), backing_(256 * MiB), pool_(backing_) {}

  void run(int ops) {
    for (int i = 0; i < ops; ++i) {
      const int r = static_cast<int>(rng_() % 100);
      if (live_.empty() || r < (live_.size() < 64 ? 55 : 35)) {
        alloc();
      } else if (r < 85) {
        free_one();
      } else if (r < 93) {
        auto& l = live_[rng_() % live_.size()];
        const uintptr_t s = kStreams[rng_() % 3];
        pool_.record_stream(reinterpret_cast<void*>(l.addr), s);
        if (s != l.stream && std::find(l.uses.begin(), l.uses.end(), s) == l.uses.end()) l.uses.push_back(s);
      } else if (r < 99) {
        backing_.complete_stream(kStreams[rng_() % 3]);
      } else {
        pool_.empty_cache();
      }
      check();
      if (HasFatalFailure() || HasNonfatalFailure()) {
        ADD_FAILURE() << "after op " << i;
        return;
      }
    }
    while (!live_.empty()) free_one();
    check();
    pool_.empty_cache();
    EXPECT_EQ(pool_.stats().reserved, 0u);
    EXPECT_TRUE(backing_.live.empty());
    EXPECT_TRUE(backing_.events.empty());
    EXPECT_GT(pool_.stats().num_backing_frees, 0u);
    if (std::getenv("BT_STRESS_VERBOSE"))
      std::printf("ooms=%d oom_retries=%llu mallocs=%llu reuses_after_event=%d\n", ooms_,
                  (unsigned long long)pool_.stats().num_oom_retries,
                  (unsigned long long)pool_.stats().num_backing_mallocs, pending_reuses_);
  }

 private:
  static bool HasFatalFailure() { return ::testing::Test::HasFatalFailure(); }
  static bool HasNonfatalFailure() { return ::testing::Test::HasNonfatalFailure(); }

  size_t random_size() {
    const int kind = static_cast<int>(rng_() % 100);
    if (kind < 70)
      return static_cast<size_t>(std::exp2(std::uniform_real_distribution<double>(0, 20)(rng_)));  // <= 1 MiB
    if (kind < 95) return MiB + rng_() % (15 * MiB);
    return 16 * MiB + rng_() % (24 * MiB);
  }

  void alloc() {
    const size_t n = random_size();
    const uintptr_t s = kStreams[rng_() % 3];
    void* p = nullptr;
    try {
      p = pool_.allocate(n, s);
    } catch (const InternalError&) {
      throw;
    } catch (const Error&) {
      ++ooms_;  // a genuine out-of-memory at the fake's capacity
      return;
    }
    Live l{reinterpret_cast<uintptr_t>(p),
           CachingPool::round_size(n),
           s,
           {},
           static_cast<unsigned char>(rng_())};
    // A new block must not overlap memory that other streams may still be using.
    for (auto& f : inflight_) {
      bool pending = false;
      for (uint64_t ev : f.events) pending |= !backing_.done(ev);
      if (pending) {
        EXPECT_FALSE(overlaps(l.addr, l.rounded, f.addr, f.size)) << "reused before its events completed";
      } else if (overlaps(l.addr, l.rounded, f.addr, f.size)) {
        ++pending_reuses_;
      }
    }
    std::memset(p, l.tag, std::min<size_t>(l.rounded, 256));
    std::memset(as_bytes(p) + l.rounded - std::min<size_t>(l.rounded, 256), l.tag,
                std::min<size_t>(l.rounded, 256));
    live_.push_back(std::move(l));
  }

  void free_one() {
    const size_t k = rng_() % live_.size();
    Live l = std::move(live_[k]);
    live_[k] = std::move(live_.back());
    live_.pop_back();
    const char* p = reinterpret_cast<const char*>(l.addr);
    EXPECT_EQ(static_cast<unsigned char>(p[0]), l.tag) << "block contents were overwritten";
    EXPECT_EQ(static_cast<unsigned char>(p[l.rounded - 1]), l.tag) << "block contents were overwritten";
    const uint64_t first_event = backing_.next_event;
    pool_.deallocate(reinterpret_cast<void*>(l.addr));
    InFlight f{l.addr, l.rounded, {}};
    for (uint64_t ev = first_event; ev < backing_.next_event; ++ev) f.events.push_back(ev);
    EXPECT_EQ(f.events.size(), l.uses.size());
    if (!f.events.empty()) inflight_.push_back(std::move(f));
    std::erase_if(inflight_, [&](const InFlight& x) {
      return std::all_of(x.events.begin(), x.events.end(), [&](uint64_t ev) { return backing_.done(ev); });
    });
  }

  void check() {
    // Live blocks never overlap.
    std::vector<const Live*> sorted;
    for (auto& l : live_) sorted.push_back(&l);
    std::sort(sorted.begin(), sorted.end(), [](const Live* a, const Live* b) { return a->addr < b->addr; });
    for (size_t i = 1; i < sorted.size(); ++i)
      ASSERT_LE(sorted[i - 1]->addr + sorted[i - 1]->rounded, sorted[i]->addr) << "live blocks overlap";

    // Segments: blocks tile them, no two free neighbours, totals match.
    auto segs = pool_.snapshot();
    size_t reserved = 0, live_blocks = 0;
    for (auto& seg : segs) {
      reserved += seg.size;
      uintptr_t at = seg.addr;
      for (size_t i = 0; i < seg.blocks.size(); ++i) {
        const auto& b = seg.blocks[i];
        ASSERT_EQ(b.addr, at) << "blocks do not tile their segment";
        at += b.size;
        if (b.state == CachingPool::BlockState::kLive) ++live_blocks;
        if (i > 0) {
          ASSERT_FALSE(b.state == CachingPool::BlockState::kFree &&
                       seg.blocks[i - 1].state == CachingPool::BlockState::kFree)
              << "two adjacent free blocks";
        }
      }
      ASSERT_EQ(at, seg.addr + seg.size);
    }
    const auto st = pool_.stats();
    ASSERT_EQ(st.reserved, reserved);
    ASSERT_EQ(backing_.used, reserved);
    ASSERT_EQ(live_blocks, live_.size());
    ASSERT_LE(st.allocated, st.reserved);
    ASSERT_LE(st.peak_allocated, st.peak_reserved);

    // Every byte of a live block is inside a segment of its stream; allocated adds up.
    size_t allocated = 0;
    for (const Live* l : sorted) {
      auto it = std::upper_bound(segs.begin(), segs.end(), l->addr,
                                 [](uintptr_t a, const CachingPool::SegmentInfo& s) { return a < s.addr; });
      ASSERT_NE(it, segs.begin()) << "live block below every segment";
      --it;
      ASSERT_LE(l->addr + l->rounded, it->addr + it->size) << "live block outside its segment";
      ASSERT_EQ(it->stream, l->stream);
      const size_t bs = pool_.block_size(reinterpret_cast<void*>(l->addr));
      ASSERT_GE(bs, l->rounded);
      if (l->rounded <= CachingPool::kSmallSize)
        ASSERT_EQ(bs, l->rounded);  // small blocks are always split exactly
      else
        ASSERT_LE(bs, l->rounded + CachingPool::kSmallSize);  // at most the unsplit <= 1 MiB tail
      allocated += bs;
    }
    ASSERT_EQ(st.allocated, allocated);
  }

  static constexpr uintptr_t kStreams[3] = {kS1, kS2, kS3};
  std::mt19937_64 rng_;
  FakeBacking backing_;
  CachingPool pool_;
  std::vector<Live> live_;
  std::vector<InFlight> inflight_;
  int ooms_ = 0;
  int pending_reuses_ = 0;  // reuses of memory whose events had completed
};

TEST(CachingPool, RandomizedStress) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    Stress(seed).run(3000);
    if (::testing::Test::HasFailure()) return;
  }
}

// Note [Allocation under capture]: while a CUDA graph is captured the pool
// queries no event and synchronizes nothing.
TEST(CachingPool, UnderCaptureEventsAreLeftForLater) {
  FakeBacking backing;
  CachingPool pool(backing);
  void* a = pool.allocate(1000, kS1);
  pool.record_stream(a, kS2);
  pool.deallocate(a);  // pending on an event of S2
  backing.complete_all();
  {
    CaptureScope capture;
    void* b = pool.allocate(1000, kS1);
    EXPECT_NE(b, a) << "a's event was collected during the capture";
    EXPECT_EQ(backing.event_queries, 0);
    pool.deallocate(b);
  }
  void* c = pool.allocate(1000, kS1);  // outside the capture the event is collected
  EXPECT_GT(backing.event_queries, 0);
  EXPECT_EQ(c, a);
  pool.deallocate(c);
}

TEST(CachingPool, UnderCaptureABlockAnotherStreamUsedLeavesCirculation) {
  FakeBacking backing;
  CachingPool pool(backing);
  void* a = nullptr;
  {
    CaptureScope capture;
    a = pool.allocate(1000, kS1);
    pool.record_stream(a, kS2);
    pool.deallocate(a);  // no event could mark the end of work that has not run: none is recorded
    EXPECT_TRUE(backing.events.empty());
    void* b = pool.allocate(1000, kS1);
    EXPECT_NE(b, a);
    pool.deallocate(b);
  }
  void* c = pool.allocate(1000, kS1);
  EXPECT_NE(c, a) << "a block of captured multi-stream work came back";
  pool.deallocate(c);
  EXPECT_EQ(pool.stats().allocated, 0u);
}

TEST(CachingPool, OutOfMemoryUnderCaptureFailsWithoutSynchronizing) {
  FakeBacking backing(4 * MiB);
  CachingPool pool(backing);
  CaptureScope capture;
  try {
    pool.allocate(12 * MiB, kS1);
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("while a CUDA graph is captured"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("train.cuda_graph: false"), std::string::npos) << e.what();
  }
  EXPECT_EQ(backing.syncs, 0);
}

}  // namespace
}  // namespace bt
