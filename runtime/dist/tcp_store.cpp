#include "runtime/dist/tcp_store.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "kernels/common/error.h"
#include "runtime/dist/auth.h"
#include "runtime/dist/tcp_socket.h"

namespace bt::dist {
namespace {

enum Op : uint8_t { kSet = 1, kCheck = 2, kAdd = 3 };

using net::recv_all;
using net::send_all;

bool send_str(int fd, const std::string& s) {
  const auto n = static_cast<uint32_t>(s.size());
  return send_all(fd, &n, sizeof n) && send_all(fd, s.data(), s.size());
}

bool recv_str(int fd, std::string& s) {
  uint32_t n = 0;
  if (!recv_all(fd, &n, sizeof n) || n > (64u << 20)) return false;
  // Grown as the bytes come (1 MiB at a time), so that a peer announcing 64
  // MiB and sending less costs rank 0 what it sent, not 64 MiB.
  s.clear();
  for (size_t have = 0; have < n;) {
    const size_t step = std::min<size_t>(n - have, size_t{1} << 20);
    s.resize(have + step);
    if (!recv_all(fd, s.data() + have, step)) return false;
    have += step;
  }
  return true;
}

/// `s` as a whole decimal int64, or false (a counter that is not one).
bool decimal(const std::string& s, int64_t* v) {
  const char* end = s.data() + s.size();
  const auto [p, ec] = std::from_chars(s.data(), end, *v);
  return ec == std::errc() && p == end && !s.empty();
}

// How long a client waits for rank 0's greeting, and rank 0 for a client's
// proof (Note [Authenticated rendezvous]).
constexpr std::chrono::milliseconds kGreetingWait{10'000}, kProofWait{1'000};

}  // namespace

TcpStore::TcpStore(const std::string& host, int port, bool serve, std::chrono::milliseconds timeout,
                   std::string token)
    : host_(host), port_(port), timeout_(timeout), token_(std::move(token)) {
  BT_CHECK(port >= 0 && port < 65536, "rendezvous: port ", port, " is not a TCP port (MASTER_PORT)");
  if (serve) {
    std::string why;
    listen_fd_ = net::listen_any(port, &port_, &why);
    BT_CHECK(listen_fd_ >= 0, "rendezvous: rank 0 cannot listen on port ", port, " (MASTER_PORT): ", why,
             "; pick a free port");
    BT_CHECK(::pipe2(wake_, O_CLOEXEC) == 0, "rendezvous: pipe() failed: ", std::strerror(errno));
    server_ = std::thread([this] { serve_loop(); });
  }

  // Connect, retrying while rank 0 may still be starting.
  std::string last;
  fd_ = net::connect_until(host_, port_, std::chrono::steady_clock::now() + timeout_, &last);
  if (fd_ < 0) {
    shutdown();  // stop the server thread before throwing
    BT_FAIL("rendezvous timeout: cannot reach ", host_, ":", port_, " (MASTER_ADDR:MASTER_PORT) within ",
            net::seconds(timeout_), " (", last, "); check that rank 0 runs and the address is reachable");
  }
  std::string why;
  if (!auth::join(fd_, token_, std::min(timeout_, kGreetingWait), &why)) {
    shutdown();
    BT_FAIL("rendezvous: ", host_, ":", port_, " (MASTER_ADDR:MASTER_PORT) did not let this rank in: ", why);
  }
}

TcpStore::~TcpStore() { shutdown(); }

void TcpStore::shutdown() {
  if (fd_ >= 0) ::close(fd_), fd_ = -1;
  if (server_.joinable()) {
    const char c = 'x';
    (void)!::write(wake_[1], &c, 1);
    server_.join();
  }
  for (int* f : {&listen_fd_, &wake_[0], &wake_[1]})
    if (*f >= 0) ::close(*f), *f = -1;
}

void TcpStore::serve_loop() {
  std::vector<pollfd> fds = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
  // Per client (fds[i + 2]): the nonce it was greeted with, until it proved
  // the token (Note [Authenticated rendezvous]).
  std::vector<std::optional<auth::Nonce>> pending;
  auto drop = [&](size_t& i) {
    ::close(fds[i].fd);
    fds.erase(fds.begin() + static_cast<std::ptrdiff_t>(i));
    pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i - 2));
    --i;
  };
  for (;;) {
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) break;  // shutting down
    if (fds[0].revents & POLLIN) {
      const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      auth::Nonce sent;
      if (c >= 0 && auth::greet(c, !token_.empty(), &sent)) {
        // A request arrives whole from a rank; a peer that stops halfway
        // through one is dropped after this long instead of stalling the store.
        const timeval tv{5, 0};
        ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        const int one = 1;  // replies leave at once, as the ranks' requests do (connect_until)
        ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fds.push_back({c, POLLIN, 0});
        pending.push_back(token_.empty() ? std::nullopt : std::optional<auth::Nonce>(sent));
      } else if (c >= 0) {
        ::close(c);
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      const int c = fds[i].fd;
      if (std::optional<auth::Nonce>& n = pending[i - 2]) {
        std::string why;
        if (auth::answer(c, *n, token_, kProofWait, &why)) {
          n.reset();
        } else {
          std::fprintf(stderr, "rendezvous: refused a connection to the store from %s: %s\n",
                       auth::peer_of(c).c_str(), why.c_str());
          drop(i);
        }
        continue;
      }
      uint8_t op = 0;
      std::string key, value;
      bool ok = recv_all(c, &op, 1) && recv_str(c, key) && recv_str(c, value);
      if (ok && op == kSet) {
        data_[key] = value;
        const uint8_t r = 1;
        ok = send_all(c, &r, 1);
      } else if (ok && op == kCheck) {
        // One write: with the reply in pieces, Nagle held each piece after the
        // first until the client's delayed ACK (40 ms per get()).
        const auto it = data_.find(key);
        std::string reply(1, it != data_.end() ? '\1' : '\0');
        if (it != data_.end()) {
          const auto n = static_cast<uint32_t>(it->second.size());
          reply.append(reinterpret_cast<const char*>(&n), sizeof n).append(it->second);
        }
        ok = send_all(c, reply.data(), reply.size());
      } else if (ok && op == kAdd) {
        const auto it = data_.find(key);
        int64_t have = 0, delta = 0;
        ok = (it == data_.end() || decimal(it->second, &have)) && decimal(value, &delta) &&
             !__builtin_add_overflow(have, delta, &have);
        if (ok) {
          data_[key] = std::to_string(have);
          ok = send_all(c, &have, sizeof have);
        }
      } else {
        ok = false;
      }
      if (!ok) drop(i);  // the client left (or spoke nonsense)
    }
  }
  for (size_t i = 2; i < fds.size(); ++i) ::close(fds[i].fd);
}

std::string TcpStore::request(uint8_t op, const std::string& key, const std::string& value) {
  BT_CHECK(send_all(fd_, &op, 1) && send_str(fd_, key) && send_str(fd_, value),
           "rendezvous: lost the connection to ", host_, ":", port_, " (rank 0 has exited?)");
  std::string reply;
  bool ok = true;
  if (op == kSet) {
    uint8_t r = 0;
    ok = recv_all(fd_, &r, 1);
  } else if (op == kCheck) {
    uint8_t found = 0;
    ok = recv_all(fd_, &found, 1);
    if (ok && found) {
      ok = recv_str(fd_, reply);
      reply.insert(0, 1, '+');
    }
  } else {
    int64_t v = 0;
    ok = recv_all(fd_, &v, sizeof v);
    reply = std::to_string(v);
  }
  BT_CHECK(ok, "rendezvous: lost the connection to ", host_, ":", port_, " (rank 0 has exited?)");
  return reply;
}

void TcpStore::set(const std::string& key, const std::string& value) { request(kSet, key, value); }

std::string TcpStore::get(const std::string& key) {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (int ms = 1;; ms = std::min(ms * 2, 100)) {
    const std::string r = request(kCheck, key, "");
    if (!r.empty()) return r.substr(1);
    BT_CHECK(std::chrono::steady_clock::now() < deadline, "rendezvous timeout: '", key,
             "' was not set within ", net::seconds(timeout_), " at ", host_, ":", port_,
             "; a rank is missing or has another WORLD_SIZE / MASTER_ADDR");
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  return std::stoll(request(kAdd, key, std::to_string(delta)));
}

}  // namespace bt::dist
