// The rendezvous store over real TCP sockets on localhost: values (binary
// ones too) and counters shared between a serving and a connecting store, a
// wait for a key set later, timeouts that name what was missing, peers
// without the job token refused and named while the store serves the ranks
// (Note [Authenticated rendezvous] in runtime/dist/auth.cpp), and clients
// that stop halfway holding no one else up (Note [A store that never waits
// on one client] in runtime/dist/tcp_store.cpp).
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "kernels/common/error.h"
#include "runtime/dist/auth.h"
#include "runtime/dist/tcp_socket.h"
#include "runtime/dist/tcp_store.h"
#include "tests/support/error_message.h"
#include "tests/support/free_port.h"

namespace bt::dist {
namespace {

using std::chrono::milliseconds;

using test::free_port;

const std::string kToken = auth::new_token();

TEST(TcpStore, SharesValuesAndCounters) {
  TcpStore server("127.0.0.1", 0, true, milliseconds(5000), kToken);
  ASSERT_GT(server.port(), 0);
  TcpStore client("localhost", server.port(), false, milliseconds(5000), kToken);
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
  TcpStore server("127.0.0.1", 0, true, milliseconds(5000), "");  // dist.insecure
  TcpStore client("127.0.0.1", server.port(), false, milliseconds(5000), "");
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
  TcpStore server("127.0.0.1", 0, true, milliseconds(300), kToken);
  std::string m = test::error_message([&] { server.get("never"); });
  EXPECT_NE(m.find("rendezvous timeout: 'never' was not set"), std::string::npos) << m;

  const int port = free_port();
  m = test::error_message([&] { TcpStore("127.0.0.1", port, false, milliseconds(300), kToken); });
  EXPECT_NE(m.find("rendezvous timeout: cannot reach 127.0.0.1:" + std::to_string(port)), std::string::npos)
      << m;

  m = test::error_message([&] { TcpStore("127.0.0.1", 70000, false, milliseconds(300), kToken); });
  EXPECT_NE(m.find("port 70000"), std::string::npos) << m;
}

// Peers that do not prove the job token -- a wrong token, none, garbage, a
// half-sent request's worth of silence -- are refused and named in rank 0's
// log (address and what they sent), each connecting side learns why, and the
// store goes on serving the job's ranks; an open store (dist.insecure) tells
// a rank that has a token, and a counter that is not one is refused.
TEST(TcpStore, PeersWithoutTheJobTokenAreRefusedAndNamedWhileTheStoreServes) {
  TcpStore server("127.0.0.1", 0, true, milliseconds(3000), kToken);
  TcpStore rank1("127.0.0.1", server.port(), false, milliseconds(3000), kToken);
  rank1.set("before", "1");
  testing::internal::CaptureStderr();
  std::string m = test::error_message(
      [&] { TcpStore("127.0.0.1", server.port(), false, milliseconds(3000), auth::new_token()); });
  EXPECT_NE(m.find("did not let this rank in: it refused this process's job token"), std::string::npos) << m;
  m = test::error_message([&] { TcpStore("127.0.0.1", server.port(), false, milliseconds(3000), ""); });
  EXPECT_NE(m.find("it asks for the job token, and this process has none: set BT_JOB_TOKEN"),
            std::string::npos)
      << m;
  std::string why;
  const int raw = net::connect_until("127.0.0.1", server.port(),
                                     std::chrono::steady_clock::now() + milliseconds(3000), &why);
  ASSERT_GE(raw, 0) << why;
  const std::string junk("\x01\x05\x00\x00\x00hello", 10);
  ASSERT_TRUE(net::send_all(raw, junk.data(), junk.size()));
  EXPECT_EQ(rank1.get("before"), "1") << "the store serves the job while a stranger stalls";
  rank1.set("after", "2");
  EXPECT_EQ(server.get("after"), "2");
  // Rank 0 drops the stranger once its second is out (having logged why).
  const timeval limit{10, 0};
  ::setsockopt(raw, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  char sink[64];
  ssize_t got = 0;
  for (ssize_t r; (r = ::recv(raw, sink, sizeof sink, 0)) > 0;) got += r;
  EXPECT_EQ(got, 41) << "it got the greeting, then nothing";
  ::close(raw);
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("rendezvous: refused a connection to the store from 127.0.0.1:"), std::string::npos)
      << log;
  EXPECT_NE(log.find("its proof of the job token is wrong"), std::string::npos) << log;
  EXPECT_NE(log.find("it closed the connection without a proof of the job token"), std::string::npos) << log;
  EXPECT_NE(log.find("it sent 10 byte(s) and then nothing: '\\x01\\x05\\x00\\x00\\x00hello'"),
            std::string::npos)
      << log;
  EXPECT_EQ(rank1.add("n", 2), 2);

  TcpStore open("127.0.0.1", 0, true, milliseconds(3000), "");
  m = test::error_message([&] { TcpStore("127.0.0.1", open.port(), false, milliseconds(3000), kToken); });
  EXPECT_NE(m.find("it runs without a job token (dist.insecure), and this process has one"),
            std::string::npos)
      << m;
  open.set("word", "seven");
  m = test::error_message([&] { open.add("word", 1); });
  EXPECT_NE(m.find("lost the connection"), std::string::npos) << m;
}

/// A connection to the store at `port` that has proved kToken.
int member(int port) {
  std::string why;
  const int fd =
      net::connect_until("127.0.0.1", port, std::chrono::steady_clock::now() + milliseconds(3000), &why);
  EXPECT_GE(fd, 0) << why;
  EXPECT_TRUE(fd < 0 || auth::join(fd, kToken, milliseconds(3000), &why)) << why;
  return fd;
}

// Note [A store that never waits on one client]: a rank stopped halfway
// through a request holds its own connection and nothing else. The others are
// served meanwhile, and its request, finished after theirs, is answered (the
// store used to wait for it, then drop it after five seconds).
TEST(TcpStore, AClientHalfwayThroughARequestHoldsOnlyItsOwnConnection) {
  TcpStore server("127.0.0.1", 0, true, milliseconds(3000), kToken);
  TcpStore rank1("127.0.0.1", server.port(), false, milliseconds(3000), kToken);
  const int slow = member(server.port());
  ASSERT_GE(slow, 0);
  const std::string request("\x01\x01\x00\x00\x00k\x01\x00\x00\x00v", 11);  // SET k = v
  ASSERT_TRUE(net::send_all(slow, request.data(), 6));                      // op and key only
  rank1.set("x", "1");
  EXPECT_EQ(rank1.get("x"), "1");
  EXPECT_EQ(rank1.add("n", 4), 4);
  EXPECT_EQ(server.add("n", 1), 5);
  ASSERT_TRUE(net::send_all(slow, request.data() + 6, request.size() - 6));
  const timeval limit{10, 0};
  ::setsockopt(slow, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  char r = 0;
  EXPECT_EQ(::recv(slow, &r, 1, 0), 1) << "the slow rank's request was not answered";
  EXPECT_EQ(r, 1);
  EXPECT_EQ(rank1.get("k"), "v");
  ::close(slow);
}

// A connection that takes the greeting and then says nothing is dropped once
// the proof's second is out, and named in rank 0's log; it never holds a
// socket of the store for longer.
TEST(TcpStore, AStrangerThatSaysNothingIsDroppedAfterASecond) {
  TcpStore server("127.0.0.1", 0, true, milliseconds(3000), kToken);
  testing::internal::CaptureStderr();
  std::string why;
  const int raw = net::connect_until("127.0.0.1", server.port(),
                                     std::chrono::steady_clock::now() + milliseconds(3000), &why);
  ASSERT_GE(raw, 0) << why;
  const timeval limit{10, 0};
  ::setsockopt(raw, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  char sink[64];
  ssize_t got = 0, r = 0;
  while ((r = ::recv(raw, sink, sizeof sink, 0)) > 0) got += r;
  EXPECT_EQ(r, 0) << "the store kept the silent connection open (recv: " << std::strerror(errno) << ")";
  EXPECT_EQ(got, 41) << "it got the greeting, then nothing";
  ::close(raw);
  TcpStore rank1("127.0.0.1", server.port(), false, milliseconds(3000), kToken);
  rank1.set("after", "1");  // the store goes on
  EXPECT_EQ(server.get("after"), "1");
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("rendezvous: refused a connection to the store from 127.0.0.1:"), std::string::npos)
      << log;
  EXPECT_NE(log.find("it sent nothing within 1 s"), std::string::npos) << log;
}

// A rank's connection that sends what is not a request -- an unknown op, a
// length over the 64 MiB limit, or a 64 MiB key announced and then not sent
// -- is dropped, and the store serves the other ranks as before (the harness
// tests/fuzz/fuzz_tcp_store.cpp tries many more such frames).
TEST(TcpStore, AMembersFramesThatAreNotRequestsDropOnlyItsConnection) {
  TcpStore server("127.0.0.1", 0, true, milliseconds(3000), kToken);
  TcpStore rank1("127.0.0.1", server.port(), false, milliseconds(3000), kToken);
  rank1.set("kept", "1");
  const std::string frames[] = {
      std::string("\x09\x01\x00\x00\x00k\x01\x00\x00\x00v", 11),        // op 9
      std::string("\x01\x01\x00\x00\x04k", 6),                          // a key of 64 MiB + 1 byte
      std::string("\x01\x00\x00\x00\x04", 5) + std::string(1000, 'k'),  // 64 MiB announced, 1000 sent
  };
  for (const std::string& frame : frames) {
    std::string why;
    const int fd = net::connect_until("127.0.0.1", server.port(),
                                      std::chrono::steady_clock::now() + milliseconds(3000), &why);
    ASSERT_GE(fd, 0) << why;
    ASSERT_TRUE(auth::join(fd, kToken, milliseconds(3000), &why)) << why;
    ASSERT_TRUE(net::send_all(fd, frame.data(), frame.size()));
    ::shutdown(fd, SHUT_WR);
    const timeval limit{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    char c;
    EXPECT_LE(::recv(fd, &c, 1, 0), 0) << "the store answered a frame that is no request";
    ::close(fd);
    EXPECT_EQ(rank1.get("kept"), "1");
  }
  EXPECT_EQ(rank1.add("n", 3), 3);
}

}  // namespace
}  // namespace bt::dist
