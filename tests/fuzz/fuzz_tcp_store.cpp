// libFuzzer target: the rendezvous store's server (runtime/dist/tcp_store.h)
// on frames from a hostile peer. One store serves on a free port of
// localhost, with a job token, for the whole run. Each input is one
// connection to it: its first byte's low bit picks who connects -- 0: a
// member, who passes the handshake with the right token and sends the other
// bytes as requests; 1: a stranger, who sends them in place of its proof of
// the token (Note [Authenticated rendezvous]). The peer then closes its
// sending side and reads the replies until the store closes the connection.
// Whatever the bytes, the store must never crash, hang, leak or trip a
// sanitizer, must close the connection once the peer is done (a stranger's at
// once), must let a member in, and must go on serving: after every input a
// rank's own connection sets, reads and adds as before.
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kernels/common/error.h"
#include "runtime/dist/auth.h"
#include "runtime/dist/tcp_store.h"
#include "tests/fuzz/fuzz_socket.h"

namespace {

// Each process its own job's token: with --jobs, a connection that reaches
// another process's port (ports are reused) is then a stranger there.
const std::string kToken = "fuzz-job-token-" + std::to_string(::getpid()) + "-0123456789abcdef";
constexpr std::chrono::milliseconds kWait{5000};
constexpr int kPeerDoneMs = 8000;  // the store closes a finished peer's connection within this

/// A failure of the harness itself (not of the store): stop loudly.
[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "fuzz_tcp_store: cannot set up: %s\n", what.c_str());
  std::abort();
}

struct Store {
  std::unique_ptr<bt::dist::TcpStore> server, rank;  // the serving rank 0, and a rank's own connection
  Store() {
    try {
      server = std::make_unique<bt::dist::TcpStore>("127.0.0.1", 0, true, kWait, kToken);
      rank = std::make_unique<bt::dist::TcpStore>("127.0.0.1", server->port(), false, kWait, kToken);
    } catch (const bt::Error& e) {
      die(e.what());
    }
  }
};

/// A new connection to the store, or the harness stops.
int connect_to(int port) {
  const int fd = bt::fuzz::connect_loopback(port);
  if (fd < 0) die(bt::cat("connect to 127.0.0.1:", port, ": ", std::strerror(errno)));
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Store store;
  static uint64_t inputs = 0;
  ++inputs;
  if (size == 0) return 0;
  const bool stranger = data[0] & 1;
  const int fd = connect_to(store.server->port());
  if (!stranger) {
    std::string why;
    if (!bt::dist::auth::join(fd, kToken, kWait, &why)) __builtin_trap();  // a member was refused
  }
  bt::fuzz::exchange(fd, reinterpret_cast<const char*>(data + 1), size - 1, kPeerDoneMs);
  ::close(fd);
  // The store still serves a rank: a value and a counter of this input's.
  try {
    const std::string value = bt::cat("input ", inputs);
    store.rank->set("fuzz/check", value);
    if (store.rank->get("fuzz/check") != value) __builtin_trap();
    store.rank->set("fuzz/counter", "40");
    if (store.rank->add("fuzz/counter", static_cast<int64_t>(inputs)) != 40 + static_cast<int64_t>(inputs))
      __builtin_trap();
  } catch (const bt::Error&) {
    __builtin_trap();  // the store stopped serving the job
  }
  return 0;
}
