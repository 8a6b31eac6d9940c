#include "runtime/dist/tcp_socket.h"

#include <cerrno>
#include <cstring>
#include <thread>

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kernels/common/error.h"

namespace bt::dist::net {

bool send_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool recv_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

int listen_any(int port, int* bound, std::string* why) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *why = std::strerror(errno);
    return -1;
  }
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 256) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    *why = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  *bound = ntohs(a.sin_port);
  return fd;
}

int connect_until(const std::string& host, int port, std::chrono::steady_clock::time_point deadline,
                  std::string* why) {
  *why = "no attempt";
  for (;;) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    const int g = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    int fd = -1;
    if (g == 0) {
      for (addrinfo* r = res; r && fd < 0; r = r->ai_next) {
        const int s = ::socket(r->ai_family, r->ai_socktype | SOCK_CLOEXEC, r->ai_protocol);
        if (s < 0) continue;
        if (::connect(s, r->ai_addr, r->ai_addrlen) == 0) {
          fd = s;
        } else {
          *why = std::strerror(errno);
          ::close(s);
        }
      }
      ::freeaddrinfo(res);
    } else {
      *why = gai_strerror(g);
    }
    if (fd >= 0) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;
    }
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::string seconds(std::chrono::milliseconds t) {
  return cat(static_cast<double>(t.count()) / 1000.0, " s");
}

}  // namespace bt::dist::net
