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
#include <unistd.h>

#include "kernels/common/error.h"
#include "runtime/dist/auth.h"
#include "runtime/dist/tcp_socket.h"

namespace bt::dist {
namespace {

enum Op : uint8_t { kSet = 1, kCheck = 2, kAdd = 3 };
constexpr uint32_t kMaxString = 64u << 20;  // a key's or a value's bytes at most

using net::recv_all;
using net::send_all;

bool send_str(int fd, const std::string& s) {
  const auto n = static_cast<uint32_t>(s.size());
  return send_all(fd, &n, sizeof n) && send_all(fd, s.data(), s.size());
}

bool recv_str(int fd, std::string& s) {
  uint32_t n = 0;
  if (!recv_all(fd, &n, sizeof n) || n > kMaxString) return false;
  // Grown as the bytes come (1 MiB at a time), so that a reply announcing 64
  // MiB and sending less costs what it sent, not 64 MiB.
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

// Note [A store that never waits on one client]
// The server thread polls every connection and keeps, for each, the bytes it
// has read and not yet used and the reply bytes it has not yet sent. It reads
// what a readable socket holds, never more, acts on a handshake or a request
// once its last byte is in, and sends what a writable socket takes. So a
// client that stops halfway through its handshake or a request, or does not
// read its replies, holds its own connection and nothing else: every other
// rank is served meanwhile. (Before, the thread read a request whole, and such
// a client held the store for the five seconds of a receive timeout, a
// stranger one second per connection.) Bounds: a connection that has not
// proved the job token within kProofWait of its greeting is dropped, so a
// stranger cannot keep a socket; a request's key and value are at most 64 MiB
// each, and one connection's next request is read only when its last reply
// has gone, so a client that sends requests without reading the replies
// holds at most one request and one reply in memory.
namespace {

/// One client connection of the server.
struct Conn {
  int fd = -1;
  std::optional<auth::Nonce> pending;  // greeted; the proof of the token is not in yet
  std::chrono::steady_clock::time_point proof_by;
  std::string in;       // read, not yet used
  std::string out;      // to send
  bool closed = false;  // the client closed its side: what is in `in` is all there will be
};

/// The length field at `at` of a request in `in`, when its 4 bytes are there.
std::optional<uint32_t> length_at(const std::string& in, size_t at) {
  if (in.size() < at + 4) return std::nullopt;
  uint32_t n = 0;
  std::memcpy(&n, in.data() + at, 4);
  return n;
}

enum class Parse { kNeedMore, kBad, kDone };

/// A whole request at the front of `in` (op, key, value), or what is missing.
Parse parse_request(const std::string& in, uint8_t* op, std::string* key, std::string* value, size_t* used) {
  if (in.empty()) return Parse::kNeedMore;
  *op = static_cast<uint8_t>(in[0]);
  if (*op != kSet && *op != kCheck && *op != kAdd) return Parse::kBad;
  const std::optional<uint32_t> nk = length_at(in, 1);
  if (!nk) return Parse::kNeedMore;
  if (*nk > kMaxString) return Parse::kBad;
  const std::optional<uint32_t> nv = length_at(in, 5 + *nk);
  if (!nv) return Parse::kNeedMore;
  if (*nv > kMaxString) return Parse::kBad;
  const size_t total = 9 + size_t{*nk} + *nv;
  if (in.size() < total) return Parse::kNeedMore;
  key->assign(in, 5, *nk);
  value->assign(in, 9 + *nk, *nv);
  *used = total;
  return Parse::kDone;
}

/// One poll round's transfer on client `c` (its poll events `ev`): sends what
/// the socket takes of the reply waiting, or, with none, reads what it holds.
/// False when the client is gone.
bool transfer(Conn& c, short ev) {
  if (!c.out.empty() && (ev & (POLLOUT | POLLERR | POLLHUP))) {
    const ssize_t w = ::send(c.fd, c.out.data(), c.out.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w > 0) c.out.erase(0, static_cast<size_t>(w));
    return w > 0 || errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  }
  if (c.out.empty() && (ev & (POLLIN | POLLERR | POLLHUP))) {
    char buf[1 << 16];
    const ssize_t r = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r > 0) {
      c.in.append(buf, static_cast<size_t>(r));
    } else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      c.closed = true;
    }
  }
  return true;
}

/// A connection still proving the job token: once its answer is whole,
/// checks it and queues rank 0's proof. False -- the peer named in rank 0's
/// log with the reason -- for a wrong answer, or for one that stopped short
/// and then closed the connection or ran out of its time.
bool prove(Conn& c, const std::string& token, std::chrono::steady_clock::time_point now) {
  const size_t need = auth::answer_size();
  std::string why;
  if (c.in.size() >= need) {
    auth::Digest ours;
    if (auth::check_answer(std::string_view(c.in).substr(0, need), *c.pending, token, &ours, &why)) {
      c.pending.reset();
      c.in.erase(0, need);
      c.out.assign(reinterpret_cast<const char*>(ours.data()), ours.size());
      return true;
    }
  } else if (c.closed || now >= c.proof_by) {
    why = auth::incomplete_answer(c.in, c.closed, kProofWait);
  } else {
    return true;  // the rest may still come
  }
  std::fprintf(stderr, "rendezvous: refused a connection to the store from %s: %s\n",
               auth::peer_of(c.fd).c_str(), why.c_str());
  return false;
}

}  // namespace

/// The reply to one request; false for a request that cannot be served (an
/// ADD to a value that is not an integer, or one that overflows).
bool TcpStore::serve(uint8_t op, const std::string& key, const std::string& value, std::string* reply) {
  if (op == kSet) {
    data_[key] = value;
    reply->assign(1, '\1');
    return true;
  }
  const auto it = data_.find(key);
  if (op == kCheck) {
    // One write: with the reply in pieces, Nagle held each piece after the
    // first until the client's delayed ACK (40 ms per get()).
    reply->assign(1, it != data_.end() ? '\1' : '\0');
    if (it != data_.end()) {
      const auto n = static_cast<uint32_t>(it->second.size());
      reply->append(reinterpret_cast<const char*>(&n), sizeof n).append(it->second);
    }
    return true;
  }
  int64_t have = 0, delta = 0;
  if ((it != data_.end() && !decimal(it->second, &have)) || !decimal(value, &delta) ||
      __builtin_add_overflow(have, delta, &have))
    return false;
  data_[key] = std::to_string(have);
  reply->assign(reinterpret_cast<const char*>(&have), sizeof have);
  return true;
}

void TcpStore::serve_loop() {
  using Clock = std::chrono::steady_clock;
  std::vector<Conn> conns;
  std::vector<pollfd> fds;
  for (;;) {
    // Poll the listener, the wake-up pipe and every client: for input while
    // it has no reply waiting (one request at a time), for output while it has.
    fds.assign({{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}});
    int wait_ms = -1;
    const auto now = Clock::now();
    for (const Conn& c : conns) {
      fds.push_back({c.fd, static_cast<short>(c.out.empty() ? POLLIN : POLLOUT), 0});
      if (c.pending) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(c.proof_by - now).count();
        wait_ms =
            static_cast<int>(std::max<int64_t>(0, wait_ms < 0 ? left : std::min<int64_t>(wait_ms, left)));
      }
    }
    if (::poll(fds.data(), fds.size(), wait_ms) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[1].revents) break;  // shutting down
    std::vector<bool> drop(conns.size(), false);
    for (size_t i = 0; i < conns.size(); ++i) {
      Conn& c = conns[i];
      if (!transfer(c, fds[i + 2].revents) || (c.pending && !prove(c, token_, Clock::now()))) {
        drop[i] = true;
        continue;
      }
      if (c.pending || !c.out.empty()) continue;  // the proof, or its reply, first
      uint8_t op = 0;
      std::string key, value, reply;
      size_t used = 0;
      const Parse got = parse_request(c.in, &op, &key, &value, &used);
      if (got == Parse::kDone) {
        c.in.erase(0, used);
        if (serve(op, key, value, &reply))
          c.out = std::move(reply);
        else
          drop[i] = true;  // the request cannot be served: the client spoke nonsense
      } else if (got == Parse::kBad || c.closed) {
        drop[i] = true;  // not a request, or the client left halfway through one
      }
    }
    for (size_t i = conns.size(); i-- > 0;) {
      if (!drop[i]) continue;
      ::close(conns[i].fd);
      conns.erase(conns.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (fds[0].revents & POLLIN) {
      const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      auth::Nonce sent;
      if (c >= 0 && auth::greet(c, !token_.empty(), &sent)) {
        const int one = 1;  // replies leave at once, as the ranks' requests do (connect_until)
        ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        Conn conn;
        conn.fd = c;
        if (!token_.empty()) conn.pending = sent, conn.proof_by = Clock::now() + kProofWait;
        conns.push_back(std::move(conn));
      } else if (c >= 0) {
        ::close(c);
      }
    }
  }
  for (const Conn& c : conns) ::close(c.fd);
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
