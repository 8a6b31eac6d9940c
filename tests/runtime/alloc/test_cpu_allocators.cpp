// cpu_allocator(), allocator_for() and the pinned allocator's host-memory
// fallback (the mode it runs in on machines without a GPU).

#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <sys/resource.h>

#include "kernels/common/error.h"
#include "runtime/alloc/allocator.h"
#include "runtime/alloc/pinned_allocator.h"
#include "runtime/core/device.h"
#include "runtime/core/stream.h"

namespace bt {
namespace {

constexpr size_t MiB = size_t{1} << 20;

bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

TEST(CpuAllocator, ReturnsAlignedWritableMemory) {
  Allocator& a = cpu_allocator();
  for (size_t n : {size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{1000}, 3 * MiB + 5}) {
    void* p = a.allocate(n, Stream());
    ASSERT_NE(p, nullptr) << n;
    EXPECT_TRUE(aligned(p, 64)) << n;
    std::memset(p, 0xab, n);
    a.deallocate(p);
  }
  a.deallocate(nullptr);  // like free(nullptr)
}

long minor_faults() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

// Note [Large host blocks]: a large block freed and asked for again is the
// same memory, already mapped: touching it again costs no page faults.
TEST(CpuAllocator, LargeBlocksAreCachedAndNeedNoNewPages) {
  if (!cpu_block_cache_enabled()) GTEST_SKIP() << "the cache is off (BT_CPU_CACHE=0, or AddressSanitizer)";
  Allocator& a = cpu_allocator();
  const size_t n = 64 * MiB;
  void* p = a.allocate(n, Stream());
  std::memset(p, 1, n);
  a.deallocate(p);
  void* q = a.allocate(n - 4096, Stream());  // a slightly smaller request fits the cached block
  EXPECT_EQ(q, p);
  const long before = minor_faults();
  std::memset(q, 2, n - 4096);
  EXPECT_LT(minor_faults() - before, 16) << "the cached block was mapped again";
  a.deallocate(q);
}

TEST(CpuAllocator, ZeroBytesGivesDistinctValidPointers) {
  Allocator& a = cpu_allocator();
  void* p = a.allocate(0, Stream());
  void* q = a.allocate(0, Stream());
  ASSERT_NE(p, nullptr);
  ASSERT_NE(q, nullptr);
  EXPECT_NE(p, q);
  EXPECT_TRUE(aligned(p, 64));
  *static_cast<char*>(p) = 1;  // at least one byte is usable
  a.deallocate(p);
  a.deallocate(q);
}

TEST(CpuAllocator, AbsurdSizeIsAClearError) {
  try {
    cpu_allocator().allocate(static_cast<size_t>(-8), Stream());
    FAIL() << "expected bt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bytes of host memory"), std::string::npos) << e.what();
  }
}

TEST(AllocatorFor, PicksTheDevicesAllocator) {
  EXPECT_EQ(&allocator_for(Device::cpu()), &cpu_allocator());
  if (cuda_available()) {
    EXPECT_EQ(&allocator_for(Device::cuda(0)), &cuda_allocator(0));
  } else {
    EXPECT_THROW(allocator_for(Device::cuda(0)), Error);
    EXPECT_THROW(cuda_allocator(0), Error);
    EXPECT_THROW(cuda_memory_stats(0), Error);
    EXPECT_THROW(cuda_reset_peak_stats(0), Error);
    EXPECT_THROW(cuda_empty_cache(0), Error);
  }
  EXPECT_THROW(cuda_allocator(-1), Error);
  EXPECT_THROW(cuda_allocator(1000), Error);
}

TEST(PinnedAllocator, SizeClasses) {
  EXPECT_EQ(pinned_size_class(0), 4096u);
  EXPECT_EQ(pinned_size_class(1), 4096u);
  EXPECT_EQ(pinned_size_class(4096), 4096u);
  EXPECT_EQ(pinned_size_class(4097), 8192u);
  EXPECT_EQ(pinned_size_class(3 * MiB), 4 * MiB);
  EXPECT_EQ(pinned_size_class(1024 * MiB), 1024 * MiB);
  EXPECT_EQ(pinned_size_class(1024 * MiB + 1), 1026 * MiB);
  EXPECT_EQ(pinned_size_class(3000 * MiB + 1), 3002 * MiB);
  EXPECT_THROW(pinned_size_class(static_cast<size_t>(-1)), Error);
}

TEST(PinnedAllocator, CachesFreedBlocksBySizeClass) {
  Allocator& a = pinned_allocator();
  pinned_empty_cache();
  EXPECT_EQ(pinned_cached_bytes(), 0u);

  void* p = a.allocate(1000, Stream());
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(aligned(p, 64));
  std::memset(p, 1, 1000);
  a.deallocate(p);
  EXPECT_EQ(pinned_cached_bytes(), 4096u);

  void* q = a.allocate(3000, Stream());  // same class: the cached block
  EXPECT_EQ(q, p);
  EXPECT_EQ(pinned_cached_bytes(), 0u);
  void* r = a.allocate(5000, Stream());  // 8 KiB class: a new block
  EXPECT_NE(r, p);
  std::memset(r, 2, 5000);
  a.deallocate(q);
  a.deallocate(r);
  EXPECT_EQ(pinned_cached_bytes(), 4096u + 8192u);

  // Repeated same-shape buffers (a data loader) never take new memory.
  std::set<void*> seen;
  for (int i = 0; i < 10; ++i) {
    void* b = a.allocate(3 * MiB, Stream());
    seen.insert(b);
    a.deallocate(b);
  }
  EXPECT_EQ(seen.size(), 1u);
  EXPECT_EQ(pinned_cached_bytes(), 4096u + 8192u + 4 * MiB);

  pinned_empty_cache();
  EXPECT_EQ(pinned_cached_bytes(), 0u);
}

TEST(PinnedAllocator, FallbackIgnoresStreams) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is visible: the page-locked mode is tested in cuda/";
  Allocator& a = pinned_allocator();
  pinned_empty_cache();
  // Without a device there is no asynchronous copy to wait for.
  void* p = a.allocate(10000, Stream(Device::cuda(0), nullptr));
  a.record_stream(p, Stream(Device::cuda(0), reinterpret_cast<void*>(0x1234)));
  a.deallocate(p);
  EXPECT_EQ(pinned_cached_bytes(), 16384u);
  EXPECT_EQ(a.allocate(9000, Stream()), p);
  a.deallocate(p);
  pinned_empty_cache();
}

TEST(PinnedAllocator, UnknownPointerIsAnInternalError) {
  Allocator& a = pinned_allocator();
  int x = 0;
  EXPECT_THROW(a.deallocate(&x), InternalError);
  EXPECT_THROW(a.record_stream(&x, Stream()), InternalError);
  void* p = a.allocate(1, Stream());
  a.deallocate(p);
  EXPECT_THROW(a.deallocate(p), InternalError);  // double free
  a.deallocate(nullptr);
  pinned_empty_cache();
}

}  // namespace
}  // namespace bt
