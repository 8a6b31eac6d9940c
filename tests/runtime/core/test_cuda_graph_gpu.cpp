// CudaGraph on a real GPU (skipped without one): a capture turns its small
// memset nodes into kernel nodes that write the same bytes, in the same order
// against the kernels around them, and leaves larger memsets as they are
// (Note [Small memsets as kernel nodes], runtime/core/cuda_graph.cpp).
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "kernels/copy.h"
#include "runtime/core/cuda_graph.h"
#include "runtime/core/stream.h"

namespace bt {
namespace {

#define REQUIRE_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

TEST(CudaGraphGpu, SmallMemsetsBecomeKernelsThatWriteTheSameBytesInOrder) {
  REQUIRE_GPU();
  const Stream s = Stream::create(Device::cuda(0));
  auto cs = static_cast<cudaStream_t>(s.handle());
  constexpr size_t kBytes = 1 << 16, kSlot = 8192;
  // Each memset's bytes are copied to a slot of their own and then partly
  // overwritten by the next memset: a replay that ran a write out of order
  // would leave another value in some slot. A kernel (a fill) sits between.
  struct Set {
    size_t offset, bytes;
    int value;
  };
  const std::vector<Set> sets = {{0, 4, 0},    {0, 4, 0x5a},       {8, 3, 0xff}, {16, 2048, 0x11},
                                 {0, 4, 0x7f}, {4096, 4096, 0x22}, {0, 4, 0},    {12288, kSlot, 0x33}};
  unsigned char *buf = nullptr, *copies = nullptr;
  float* marks = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&copies, sets.size() * kSlot), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&marks, sets.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(buf, 0xee, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(copies, 0xee, sets.size() * kSlot), cudaSuccess);
  ASSERT_EQ(cudaMemset(marks, 0, sets.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  CudaGraph g;
  g.capture(s, [&] {
    for (size_t i = 0; i < sets.size(); ++i) {
      ASSERT_EQ(cudaMemsetAsync(buf + sets[i].offset, sets[i].value, sets[i].bytes, cs), cudaSuccess);
      // 1.0f is not one byte repeated, so this is a fill kernel, not another memset.
      kernels::cuda::fill(DType::F32, marks + i, 1, 1.0 + static_cast<double>(i), cs);
      ASSERT_EQ(cudaMemcpyAsync(copies + i * kSlot, buf + sets[i].offset, sets[i].bytes,
                                cudaMemcpyDeviceToDevice, cs),
                cudaSuccess);
    }
  });
  ASSERT_TRUE(g.captured());
  EXPECT_EQ(g.memsets_replaced(), 7u) << "all but the 8 KiB memset";
  g.replay(s);
  s.synchronize();
  std::vector<unsigned char> host(sets.size() * kSlot);
  std::vector<float> mark(sets.size());
  ASSERT_EQ(cudaMemcpy(host.data(), copies, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(mark.data(), marks, mark.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < sets.size(); ++i) {
    for (size_t b = 0; b < sets[i].bytes; ++b)
      ASSERT_EQ(host[i * kSlot + b], static_cast<unsigned char>(sets[i].value))
          << "memset " << i << " byte " << b;
    if (sets[i].bytes < kSlot) EXPECT_EQ(host[i * kSlot + sets[i].bytes], 0xee) << "memset " << i;
    EXPECT_EQ(mark[i], 1.0f + static_cast<float>(i)) << "the fill after memset " << i;
  }
  EXPECT_EQ(cudaFree(buf), cudaSuccess);
  EXPECT_EQ(cudaFree(copies), cudaSuccess);
  EXPECT_EQ(cudaFree(marks), cudaSuccess);
}

// The kernel a memset node becomes, launched on its own: 1-, 2- and 4-byte
// elements take the value's low 8, 16 and 32 bits, and nothing past the row.
TEST(CudaGraphGpu, MemsetKernelWritesTheValuesLowBitsPerElement) {
  REQUIRE_GPU();
  unsigned char* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, 4096 + 64), cudaSuccess);
  for (unsigned es : {1u, 2u, 4u}) {
    for (size_t width : {size_t{1}, size_t{33}, size_t{4096} / es}) {
      ASSERT_EQ(cudaMemset(buf, 0xee, 4096 + 64), cudaSuccess);
      cudaMemsetParams p{};
      p.dst = buf;
      p.elementSize = es;
      p.width = width;
      p.height = 1;
      p.value = 0x12345678u;
      kernels::cuda::MemsetKernelNode k;
      ASSERT_TRUE(kernels::cuda::memset_kernel_node(p, &k));
      ASSERT_EQ(cudaLaunchKernel(k.params.func, k.params.gridDim, k.params.blockDim, k.params.kernelParams, 0,
                                 nullptr),
                cudaSuccess);
      std::vector<unsigned char> host(4096 + 64);
      ASSERT_EQ(cudaMemcpy(host.data(), buf, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      const uint32_t v = p.value;
      for (size_t b = 0; b < width * es; ++b)
        ASSERT_EQ(host[b], static_cast<unsigned char>(v >> (8 * (b % es))))
            << es << " x " << width << ", byte " << b;
      EXPECT_EQ(host[width * es], 0xee) << es << " x " << width << ": past the row";
    }
  }
  EXPECT_EQ(cudaFree(buf), cudaSuccess);
}

TEST(CudaGraphGpu, MemsetKernelNodeTakesOneRowOfAtMostTheLimit) {
  cudaMemsetParams p{};
  kernels::cuda::MemsetKernelNode k;
  p.dst = reinterpret_cast<void*>(0x1000);
  p.elementSize = 4;
  p.height = 1;
  p.width = kernels::cuda::kMemsetKernelMaxBytes / 4;
  p.value = 0xdeadbeef;
  ASSERT_TRUE(kernels::cuda::memset_kernel_node(p, &k));
  EXPECT_EQ(k.count, p.width);
  EXPECT_EQ(k.value, 0xdeadbeefu);
  EXPECT_EQ(k.params.gridDim.x, 1u);
  EXPECT_EQ(k.params.blockDim.x, 256u);
  EXPECT_EQ(k.params.kernelParams, k.args);
  p.width += 1;  // one element over
  EXPECT_FALSE(kernels::cuda::memset_kernel_node(p, &k));
  p.width = 4;
  p.height = 2;  // two rows
  EXPECT_FALSE(kernels::cuda::memset_kernel_node(p, &k));
  p.height = 1;
  p.elementSize = 8;
  EXPECT_FALSE(kernels::cuda::memset_kernel_node(p, &k));
  p.elementSize = 1;
  p.width = 0;
  EXPECT_FALSE(kernels::cuda::memset_kernel_node(p, &k));
}

}  // namespace
}  // namespace bt
