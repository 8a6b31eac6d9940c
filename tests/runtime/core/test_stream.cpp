// Streams without a GPU: a CPU stream is a tag, and StreamGuard's bookkeeping
// of each CUDA device's current stream (per thread, restored on scope exit)
// needs no CUDA call, so it is checked here with made-up handles that are
// never used. test_stream_gpu.cpp runs real CUDA streams.
#include <thread>

#include <gtest/gtest.h>

#include "runtime/core/stream.h"
#include "tests/support/error_message.h"

namespace bt {
namespace {

void* fake(uintptr_t h) { return reinterpret_cast<void*>(h); }

TEST(Stream, ACpuStreamIsATag) {
  const Stream s = Stream::create(Device::cpu(), /*high_priority=*/true);
  EXPECT_TRUE(s.device().is_cpu());
  EXPECT_EQ(s.handle(), nullptr);
  EXPECT_EQ(s, Stream());
  EXPECT_EQ(Stream::current(Device::cpu()), Stream());
  s.synchronize();
  stream_wait(s, Stream::current(Device::cpu()));
  {
    StreamGuard g(s);
    EXPECT_EQ(Stream::current(Device::cpu()), Stream());
  }
  device_synchronize();  // a no-op without devices
}

TEST(Stream, EqualityIsDeviceAndHandle) {
  EXPECT_EQ(Stream(Device::cuda(0), fake(16)), Stream(Device::cuda(0), fake(16)));
  EXPECT_NE(Stream(Device::cuda(0), fake(16)), Stream(Device::cuda(1), fake(16)));
  EXPECT_NE(Stream(Device::cuda(0), fake(16)), Stream(Device::cuda(0), fake(32)));
  EXPECT_NE(Stream(Device::cuda(0), nullptr), Stream());  // cuda:0's default stream is not the CPU's
  EXPECT_EQ(Stream(Device::cuda(0), fake(16)).id(), 16u);
}

TEST(Stream, GuardsNestAndRestorePerDevice) {
  const Device d0 = Device::cuda(0), d1 = Device::cuda(1);
  EXPECT_EQ(Stream::current(d0).handle(), nullptr) << "the legacy default stream until a guard";
  {
    StreamGuard a(Stream(d0, fake(16)));
    EXPECT_EQ(Stream::current(d0).handle(), fake(16));
    EXPECT_EQ(Stream::current(d1).handle(), nullptr) << "another device keeps its own";
    {
      StreamGuard b(Stream(d0, fake(32)));
      StreamGuard c(Stream(d1, fake(48)));
      EXPECT_EQ(Stream::current(d0).handle(), fake(32));
      EXPECT_EQ(Stream::current(d1).handle(), fake(48));
      Stream other;
      std::thread([&] { other = Stream::current(d0); }).join();
      EXPECT_EQ(other.handle(), nullptr) << "the current stream is per thread";
    }
    EXPECT_EQ(Stream::current(d0).handle(), fake(16));
    EXPECT_EQ(Stream::current(d1).handle(), nullptr);
  }
  EXPECT_EQ(Stream::current(d0).handle(), nullptr);
}

TEST(Stream, WaitingOnItselfIsANoOp) {
  const Stream s(Device::cuda(0), fake(16));
  stream_wait(s, s);  // returns before any CUDA call
  stream_wait(s, Stream());
  stream_wait(Stream(), s);
}

TEST(Stream, ACudaStreamWhereNoneCanBeIsAClearError) {
  const Device missing = Device::cuda(cuda_device_count());
  const std::string msg = test::error_message([&] { (void)Stream::create(missing); });
  EXPECT_NE(msg.find(missing.str()), std::string::npos) << msg;
}

}  // namespace
}  // namespace bt
