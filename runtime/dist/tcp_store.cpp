#include "runtime/dist/tcp_store.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kernels/common/error.h"
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
  s.resize(n);
  return recv_all(fd, s.data(), n);
}

std::string seconds(std::chrono::milliseconds t) { return cat(t.count() / 1000.0, " s"); }

}  // namespace

TcpStore::TcpStore(const std::string& host, int port, bool serve, std::chrono::milliseconds timeout)
    : host_(host), port_(port), timeout_(timeout) {
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
            seconds(timeout_), " (", last, "); check that rank 0 runs and the address is reachable");
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
  for (;;) {
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) break;  // shutting down
    if (fds[0].revents & POLLIN) {
      const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) fds.push_back({c, POLLIN, 0});
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      const int c = fds[i].fd;
      uint8_t op = 0;
      std::string key, value;
      bool ok = recv_all(c, &op, 1) && recv_str(c, key) && recv_str(c, value);
      if (ok && op == kSet) {
        data_[key] = value;
        const uint8_t r = 1;
        ok = send_all(c, &r, 1);
      } else if (ok && op == kCheck) {
        const auto it = data_.find(key);
        const uint8_t found = it != data_.end();
        ok = send_all(c, &found, 1) && (!found || send_str(c, it->second));
      } else if (ok && op == kAdd) {
        const auto it = data_.find(key);
        const int64_t v = (it == data_.end() ? 0 : std::stoll(it->second)) + std::stoll(value);
        data_[key] = std::to_string(v);
        ok = send_all(c, &v, sizeof v);
      } else {
        ok = false;
      }
      if (!ok) {  // the client left (or spoke nonsense): drop it
        ::close(c);
        fds.erase(fds.begin() + static_cast<std::ptrdiff_t>(i));
        --i;
      }
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
             "' was not set within ", seconds(timeout_), " at ", host_, ":", port_,
             "; a rank is missing or has another WORLD_SIZE / MASTER_ADDR");
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  return std::stoll(request(kAdd, key, std::to_string(delta)));
}

}  // namespace bt::dist
