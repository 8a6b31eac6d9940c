// The CUDA caching allocator and the page-locked pinned allocator on a real
// device. Every test skips when no CUDA device is visible.

#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "kernels/common/error.h"
#include "runtime/alloc/allocator.h"
#include "runtime/alloc/pinned_allocator.h"
#include "runtime/core/device.h"
#include "runtime/core/stream.h"

namespace bt {
namespace {

constexpr size_t MiB = size_t{1} << 20;
constexpr size_t GiB = size_t{1} << 30;

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible"

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

const Device kDev = Device::cuda(0);

TEST(CudaAllocator, FreedBlockIsReused) {
  SKIP_WITHOUT_GPU();
  Allocator& a = cuda_allocator(0);
  Stream s = Stream::create(kDev);
  void* p = a.allocate(3 * MiB + 100, s);
  ASSERT_NE(p, nullptr);
  CUDA_OK(cudaMemsetAsync(p, 0, 3 * MiB + 100, static_cast<cudaStream_t>(s.handle())));
  const auto mallocs = cuda_memory_stats(0).num_backing_mallocs;
  a.deallocate(p);
  void* q = a.allocate(3 * MiB + 100, s);
  EXPECT_EQ(q, p);
  EXPECT_EQ(cuda_memory_stats(0).num_backing_mallocs, mallocs);
  a.deallocate(q);
  s.synchronize();
}

TEST(CudaAllocator, PeakStatistics) {
  SKIP_WITHOUT_GPU();
  Allocator& a = cuda_allocator(0);
  Stream s = Stream::create(kDev);
  cuda_reset_peak_stats(0);
  const size_t base = cuda_memory_stats(0).allocated;
  std::vector<void*> ps;
  for (int i = 0; i < 3; ++i) ps.push_back(a.allocate(64 * MiB, s));
  EXPECT_EQ(cuda_memory_stats(0).allocated, base + 192 * MiB);
  for (void* p : ps) a.deallocate(p);
  auto st = cuda_memory_stats(0);
  EXPECT_EQ(st.allocated, base);
  EXPECT_GE(st.peak_allocated, 192 * MiB);
  EXPECT_GE(st.reserved, 192 * MiB);  // cached
  EXPECT_GE(st.num_allocs, 3u);
  cuda_reset_peak_stats(0);
  void* small = a.allocate(MiB, s);
  st = cuda_memory_stats(0);
  EXPECT_EQ(st.peak_allocated, base + MiB);
  EXPECT_LT(st.peak_allocated, 192 * MiB);
  a.deallocate(small);
}

TEST(CudaAllocator, EmptyCacheReturnsEverythingWhenNothingIsLive) {
  SKIP_WITHOUT_GPU();
  Allocator& a = cuda_allocator(0);
  Stream s = Stream::create(kDev);
  void* p = a.allocate(100 * MiB, s);
  void* q = a.allocate(1000, s);
  a.deallocate(p);
  a.deallocate(q);
  ASSERT_EQ(cuda_memory_stats(0).allocated, 0u) << "another test leaked a block";
  EXPECT_GE(cuda_memory_stats(0).reserved, 100 * MiB);
  const auto frees = cuda_memory_stats(0).num_backing_frees;
  cuda_empty_cache(0);
  auto st = cuda_memory_stats(0);
  EXPECT_EQ(st.reserved, 0u);
  EXPECT_GE(st.num_backing_frees, frees + 2);
}

TEST(CudaAllocator, CrossStreamUseDefersReuse) {
  SKIP_WITHOUT_GPU();
  Allocator& a = cuda_allocator(0);
  Stream sa = Stream::create(kDev);
  Stream sb = Stream::create(kDev);
  auto cb = static_cast<cudaStream_t>(sb.handle());
  const size_t n = 256 * MiB;

  void* buf = a.allocate(n, sa);
  CUDA_OK(cudaMemsetAsync(buf, 1, n, static_cast<cudaStream_t>(sa.handle())));
  sa.synchronize();
  // Long-running work on B that reads buf: device-to-host copies of 256 MiB.
  void* host = pinned_allocator().allocate(n, sb);
  for (int i = 0; i < 8; ++i) CUDA_OK(cudaMemcpyAsync(host, buf, n, cudaMemcpyDeviceToHost, cb));
  a.record_stream(buf, sb);
  a.deallocate(buf);
  ASSERT_EQ(cudaStreamQuery(cb), cudaErrorNotReady) << "B finished too early for the test to mean anything";
  (void)cudaGetLastError();

  void* q = a.allocate(n, sa);  // B may still read buf: must not get it
  EXPECT_NE(q, buf);
  const bool b_still_running = cudaStreamQuery(cb) == cudaErrorNotReady;
  (void)cudaGetLastError();
  EXPECT_TRUE(b_still_running);

  sb.synchronize();
  void* r = a.allocate(n, sa);  // B's event has completed: buf is back in the pool
  EXPECT_EQ(r, buf);
  a.deallocate(q);
  a.deallocate(r);
  pinned_allocator().deallocate(host);
  sa.synchronize();
}

TEST(CudaAllocator, OomFlushesTheCacheAndRetries) {
  SKIP_WITHOUT_GPU();
  Allocator& a = cuda_allocator(0);
  Stream s = Stream::create(kDev);
  cuda_empty_cache(0);
  size_t free_b = 0, total_b = 0;
  CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
  ASSERT_GE(free_b, 4 * GiB);
  // Cache almost all free memory in 1 GiB segments, leaving 1..2 GiB free.
  const size_t k = free_b / GiB - 1;
  std::vector<void*> blocks;
  for (size_t i = 0; i < k; ++i) blocks.push_back(a.allocate(GiB, s));
  for (void* p : blocks) a.deallocate(p);
  const auto before = cuda_memory_stats(0);
  EXPECT_GE(before.reserved, k * GiB);

  // 3 GiB fits in no cached segment and not in the free memory: flush, retry.
  void* big = a.allocate(3 * GiB, s);
  ASSERT_NE(big, nullptr);
  const auto after = cuda_memory_stats(0);
  EXPECT_EQ(after.num_oom_retries, before.num_oom_retries + 1);
  EXPECT_GE(after.num_backing_frees, before.num_backing_frees + k);
  EXPECT_EQ(after.reserved, 3 * GiB);
  a.deallocate(big);
  cuda_empty_cache(0);
}

TEST(CudaAllocator, OomErrorIsClear) {
  SKIP_WITHOUT_GPU();
  Stream s = Stream::create(kDev);
  const size_t huge = size_t{1} << 50;  // 1 PiB
  try {
    cuda_allocator(0).allocate(huge, s);
    FAIL() << "expected bt::Error";
  } catch (const InternalError& e) {
    FAIL() << e.what();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory on cuda:0"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(huge)), std::string::npos) << msg;
    EXPECT_NE(msg.find("in total"), std::string::npos) << msg;  // the device's capacity
    EXPECT_NE(msg.find("batch size"), std::string::npos) << msg;
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);    // no sticky error left behind
  void* p = cuda_allocator(0).allocate(MiB, s);  // still usable
  cuda_allocator(0).deallocate(p);
}

TEST(CudaAllocator, CpuStreamMeansTheCurrentStream) {
  SKIP_WITHOUT_GPU();
  void* p = cuda_allocator(0).allocate(1000, Stream());
  cuda_allocator(0).deallocate(p);
  void* q = cuda_allocator(0).allocate(1000, Stream::current(kDev));
  EXPECT_EQ(q, p);
  cuda_allocator(0).deallocate(q);
}

TEST(CudaPinnedAllocator, IsPageLockedHostMemory) {
  SKIP_WITHOUT_GPU();
  void* p = pinned_allocator().allocate(MiB, Stream());
  cudaPointerAttributes attr{};
  CUDA_OK(cudaPointerGetAttributes(&attr, p));
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  pinned_allocator().deallocate(p);
}

TEST(CudaPinnedAllocator, ReuseWaitsForAsyncCopies) {
  SKIP_WITHOUT_GPU();
  pinned_empty_cache();
  Allocator& pa = pinned_allocator();
  Stream s = Stream::create(kDev);
  auto cs = static_cast<cudaStream_t>(s.handle());
  const size_t n = 256 * MiB;
  void* dev = cuda_allocator(0).allocate(n, s);
  void* host = pa.allocate(n, Stream());
  for (int i = 0; i < 8; ++i) CUDA_OK(cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, cs));
  pa.record_stream(host, s);
  pa.deallocate(host);
  EXPECT_EQ(pinned_cached_bytes(), 0u);  // the copies may still read it
  void* other = pa.allocate(n, Stream());
  EXPECT_NE(other, host);
  s.synchronize();
  EXPECT_EQ(pinned_cached_bytes(), n);
  void* again = pa.allocate(n, Stream());
  EXPECT_EQ(again, host);
  pa.deallocate(other);
  pa.deallocate(again);
  cuda_allocator(0).deallocate(dev);
  s.synchronize();
  pinned_empty_cache();
  EXPECT_EQ(pinned_cached_bytes(), 0u);
}

}  // namespace
}  // namespace bt
