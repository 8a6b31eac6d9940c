// For the fuzz targets of the TCP protocols: a connection to a port of this
// machine that survives libFuzzer's timer signal, and one peer's exchange of
// bytes with the server under test.
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace bt::fuzz {

/// A connection to 127.0.0.1:port with TCP_NODELAY, or -1 (errno says why).
/// A connect() that a signal interrupts is finished, not given up.
inline int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
  if (!ok && errno == EINTR) {
    pollfd p{fd, POLLOUT, 0};
    int ready;
    while ((ready = ::poll(&p, 1, -1)) < 0 && errno == EINTR) {
    }
    int err = 0;
    socklen_t len = sizeof err;
    ok = ready > 0 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    if (!ok && err != 0) errno = err;
  }
  if (!ok) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

/// Sends n bytes from p while taking whatever comes back (so that neither
/// side waits on a full buffer; the first `keep` bytes of it appended to
/// `got` when given), closes the sending side, and reads until the server
/// closes the connection. A server that has done neither within deadline_ms
/// (it kept the connection open: a hang) traps. What is left unsent when the
/// server drops the connection is not sent.
inline void exchange(int fd, const char* p, size_t n, int deadline_ms, std::string* got = nullptr,
                     size_t keep = 0) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(deadline_ms);
  bool writing = true;
  static thread_local char sink[1 << 16];
  for (;;) {
    if (writing && n == 0) {
      ::shutdown(fd, SHUT_WR);
      writing = false;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) __builtin_trap();  // the server neither finished nor dropped the peer
    pollfd pfd{fd, static_cast<short>(POLLIN | (writing ? POLLOUT : 0)), 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) {
      std::fprintf(stderr, "fuzz exchange: poll: %s\n", std::strerror(errno));
      std::abort();
    }
    if (ready == 0) continue;
    if (writing && (pfd.revents & (POLLOUT | POLLERR | POLLHUP))) {
      const ssize_t w = ::send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w > 0) {
        p += w, n -= static_cast<size_t>(w);
      } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        writing = false;  // the server dropped the connection
      }
    }
    if (pfd.revents & (POLLIN | POLLERR | POLLHUP)) {
      const ssize_t r = ::recv(fd, sink, sizeof sink, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return;
      if (r > 0 && got)
        got->append(sink, std::min(static_cast<size_t>(r), keep - std::min(keep, got->size())));
    }
  }
}

}  // namespace bt::fuzz
