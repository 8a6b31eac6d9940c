#include "tests/support/stranger.h"

#include <chrono>
#include <thread>

#include <sys/socket.h>
#include <unistd.h>

#include "kernels/common/error.h"
#include "runtime/dist/auth.h"
#include "runtime/dist/tcp_socket.h"

namespace bt::test {

std::string recorded_proof(const std::string& token) {
  int fd[2];
  BT_CHECK(::socketpair(AF_UNIX, SOCK_STREAM, 0, fd) == 0, "recorded_proof: socketpair failed");
  dist::auth::Nonce n;
  std::string proof(72, '\0');
  const bool greeted = dist::auth::greet(fd[0], true, &n);
  std::string why;
  std::thread peer([&] { dist::auth::join(fd[1], token, std::chrono::milliseconds(2000), &why); });
  const bool got = greeted && dist::net::recv_all(fd[0], proof.data(), proof.size());
  ::shutdown(fd[0], SHUT_RDWR);  // the peer's wait for rank 0's proof ends
  peer.join();
  ::close(fd[0]);
  ::close(fd[1]);
  BT_CHECK(got, "recorded_proof: the handshake did not produce a proof");
  return proof;
}

void as_stranger(int port, const std::function<void(int fd)>& act) {
  std::string why;
  const int fd = dist::net::connect_until("127.0.0.1", port,
                                          std::chrono::steady_clock::now() + std::chrono::seconds(10), &why);
  BT_CHECK(fd >= 0, "as_stranger: cannot connect to 127.0.0.1:", port, ": ", why);
  act(fd);
  char sink[64];
  while (::recv(fd, sink, sizeof sink, 0) > 0) {  // until rank 0 drops it
  }
  ::close(fd);
}

}  // namespace bt::test
