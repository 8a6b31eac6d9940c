// The rendezvous store over real TCP sockets on localhost: values (binary
// ones too) and counters shared between a serving and a connecting store, a
// wait for a key set later, and timeouts that name what was missing.
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "kernels/common/error.h"
#include "runtime/dist/tcp_store.h"
#include "tests/support/error_message.h"
#include "tests/support/free_port.h"

namespace bt::dist {
namespace {

using std::chrono::milliseconds;

using test::free_port;

TEST(TcpStore, SharesValuesAndCounters) {
  TcpStore server("127.0.0.1", 0, true, milliseconds(5000));
  ASSERT_GT(server.port(), 0);
  TcpStore client("localhost", server.port(), false, milliseconds(5000));
  client.set("a", "one");
  EXPECT_EQ(server.get("a"), "one");
  server.set("a", "two");
  EXPECT_EQ(client.get("a"), "two");
  const std::string binary("\0\x01\xff id", 6);
  client.set("bin", binary);
  EXPECT_EQ(server.get("bin"), binary);
  EXPECT_EQ(client.add("n", 5), 5);
  EXPECT_EQ(server.add("n", -2), 3);
  EXPECT_EQ(client.add("n", 0), 3);
}

TEST(TcpStore, GetWaitsForALaterSet) {
  TcpStore server("127.0.0.1", 0, true, milliseconds(5000));
  TcpStore client("127.0.0.1", server.port(), false, milliseconds(5000));
  std::thread later([&] {
    std::this_thread::sleep_for(milliseconds(200));
    server.set("late", "here");
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(client.get("late"), "here");
  EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(150));
  later.join();
}

TEST(TcpStore, TimeoutsNameWhatIsMissing) {
  TcpStore server("127.0.0.1", 0, true, milliseconds(300));
  std::string m = test::error_message([&] { server.get("never"); });
  EXPECT_NE(m.find("rendezvous timeout: 'never' was not set"), std::string::npos) << m;

  const int port = free_port();
  m = test::error_message([&] { TcpStore("127.0.0.1", port, false, milliseconds(300)); });
  EXPECT_NE(m.find("rendezvous timeout: cannot reach 127.0.0.1:" + std::to_string(port)), std::string::npos)
      << m;

  m = test::error_message([&] { TcpStore("127.0.0.1", 70000, false, milliseconds(300)); });
  EXPECT_NE(m.find("port 70000"), std::string::npos) << m;
}

}  // namespace
}  // namespace bt::dist
