// For the fuzz targets of the TCP protocols: a connection to a port of this
// machine that survives libFuzzer's timer signal.
#pragma once

#include <cerrno>

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

}  // namespace bt::fuzz
