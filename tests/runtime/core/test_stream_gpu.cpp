// Real CUDA streams (skipped without a GPU): created streams are distinct
// and keep their priority, tensors made under a StreamGuard live on its
// stream, stream_wait orders a consumer after what a producer queued, and
// DeviceGuard puts the current device back.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "runtime/core/stream.h"
#include "runtime/tensor/factory.h"

namespace bt {
namespace {

#define REQUIRE_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

int priority(const Stream& s) {
  int p = 0;
  EXPECT_EQ(cudaStreamGetPriority(static_cast<cudaStream_t>(s.handle()), &p), cudaSuccess);
  return p;
}

TEST(StreamGpu, CreatedStreamsAreDistinctWithTheirPriority) {
  REQUIRE_GPU();
  const Device d = Device::cuda(0);
  const Stream a = Stream::create(d), b = Stream::create(d), hi = Stream::create(d, /*high_priority=*/true);
  EXPECT_NE(a.handle(), nullptr);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.device(), d);
  int lowest = 0, highest = 0;
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&lowest, &highest), cudaSuccess);
  EXPECT_EQ(priority(a), lowest);
  EXPECT_EQ(priority(hi), highest);
  unsigned flags = 0;
  ASSERT_EQ(cudaStreamGetFlags(static_cast<cudaStream_t>(a.handle()), &flags), cudaSuccess);
  EXPECT_EQ(flags & cudaStreamNonBlocking, cudaStreamNonBlocking)
      << "no implicit sync with the default stream";
}

TEST(StreamGpu, TensorsMadeUnderAGuardLiveOnItsStream) {
  REQUIRE_GPU();
  const Device d = Device::cuda(0);
  const Stream s = Stream::create(d);
  {
    StreamGuard g(s);
    EXPECT_EQ(Stream::current(d), s);
    EXPECT_EQ(zeros({16}, TensorOptions{}.with_device(d)).stream(), s);
  }
  EXPECT_EQ(zeros({16}, TensorOptions{}.with_device(d)).stream().handle(), nullptr);
  s.synchronize();
}

// The producer queues many passes over a large buffer, ending in a known
// value; the consumer copies the buffer's end to the host right after
// stream_wait. Without the wait the copy runs while the producer is still
// writing and sees an earlier pass (or nothing written yet).
TEST(StreamGpu, WaitOrdersAConsumerAfterAProducer) {
  REQUIRE_GPU();
  const Device d = Device::cuda(0);
  const Stream producer = Stream::create(d), consumer = Stream::create(d);
  const int64_t n = int64_t{1} << 26;  // 256 MiB of f32
  const int passes = 32;
  Tensor x;
  {
    StreamGuard g(producer);
    x = empty({n}, TensorOptions{}.with_device(d));
    for (int i = 1; i <= passes; ++i) x.fill_(i);
  }
  std::vector<float> seen;
  {
    StreamGuard g(consumer);
    stream_wait(consumer, producer);
    seen = x.narrow(0, n - 4096, 4096).to_vector<float>();  // copies on the consumer
  }
  for (float v : seen) ASSERT_EQ(v, static_cast<float>(passes));
  device_synchronize();
}

TEST(StreamGpu, DeviceGuardRestoresTheCurrentDevice) {
  REQUIRE_GPU();
  int before = -1, inside = -1, after = -1;
  ASSERT_EQ(cudaGetDevice(&before), cudaSuccess);
  const int other = cuda_device_count() > 1 ? 1 - before % 2 : before;
  {
    DeviceGuard g(Device::cuda(other));
    ASSERT_EQ(cudaGetDevice(&inside), cudaSuccess);
  }
  ASSERT_EQ(cudaGetDevice(&after), cudaSuccess);
  EXPECT_EQ(inside, other);
  EXPECT_EQ(after, before);
}

}  // namespace
}  // namespace bt
