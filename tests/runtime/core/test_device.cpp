// Device names: what parse_device accepts, what str() prints (and parses
// back), equality, and the errors for a device this process cannot use.
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "runtime/core/device.h"
#include "tests/support/error_message.h"

namespace bt {
namespace {

TEST(Device, PrintsWhatItParses) {
  for (const Device& d : {Device::cpu(), Device::cuda(0), Device::cuda(3), Device::cuda(12)}) {
    EXPECT_EQ(parse_device(d.str()), d) << d;
    std::ostringstream os;
    os << d;
    EXPECT_EQ(os.str(), d.str());
  }
  EXPECT_EQ(Device::cpu().str(), "cpu");
  EXPECT_EQ(Device::cuda(7).str(), "cuda:7");
  EXPECT_EQ(parse_device("cuda"), Device::cuda(0));
  EXPECT_TRUE(parse_device("cpu").is_cpu());
  EXPECT_TRUE(parse_device("cuda:2").is_cuda());
  EXPECT_EQ(parse_device("cuda:2").index, 2);
}

TEST(Device, EqualityIgnoresTheIndexOfTheCpu) {
  EXPECT_EQ((Device{DeviceType::CPU, 5}), Device::cpu());
  EXPECT_NE(Device::cuda(0), Device::cuda(1));
  EXPECT_NE(Device::cpu(), Device::cuda(0));
  EXPECT_EQ(Device::cuda(1), parse_device("cuda:1"));
}

TEST(Device, AnUnknownNameIsAnErrorThatQuotesIt) {
  for (const std::string bad : {"cuda:x", "cuda:", "cuda:-1", "cuda:1x", "cuda:+1", "cuda:99999999999",
                                "cuda 0", "CPU", "gpu", "", " cpu"}) {
    const std::string msg = test::error_message([&] { (void)parse_device(bad); });
    EXPECT_NE(msg.find("'" + bad + "'"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("use cpu, cuda or cuda:N"), std::string::npos) << bad << ": " << msg;
  }
}

TEST(Device, ADeviceThatIsNotHereIsAClearError) {
  const int n = cuda_device_count();
  EXPECT_GE(n, 0);
  EXPECT_EQ(cuda_available(), n > 0);
  check_device_usable(Device::cpu());  // never throws
  set_current_device(Device::cpu());   // a no-op
  { DeviceGuard g(Device::cpu()); }

  // One past the last visible device: "no CUDA device" or "does not exist",
  // either way naming it and what to use instead.
  const Device missing = Device::cuda(n);
  const std::string msg = test::error_message([&] { check_device_usable(missing); });
  EXPECT_NE(msg.find(missing.str()), std::string::npos) << msg;
  if (n == 0) {
    EXPECT_NE(msg.find("use device cpu"), std::string::npos) << msg;
  } else {
    EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cuda:0..cuda:" + std::to_string(n - 1)), std::string::npos) << msg;
  }
#ifdef BT_CUDA
  // Selecting it fails the same way (without CUDA both are no-ops).
  EXPECT_NE(test::error_message([&] { set_current_device(missing); }).find(missing.str()), std::string::npos);
  EXPECT_NE(test::error_message([&] { DeviceGuard g(missing); }).find(missing.str()), std::string::npos);
#endif
}

}  // namespace
}  // namespace bt
