// POSIX TCP helpers shared by the rendezvous store (tcp_store.h) and the TCP
// process group (tcp_process_group.h): whole-buffer blocking transfers (EINTR
// retried, SIGPIPE suppressed), a listening socket on every interface, and a
// connect that retries until a deadline, and how their messages show a wait.
// IPv4, as the rendezvous.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace bt::dist::net {

/// Sends all n bytes; false when the connection is gone.
bool send_all(int fd, const void* p, size_t n);
/// Receives exactly n bytes; false on end of stream or a connection error.
bool recv_all(int fd, void* p, size_t n);
/// A socket listening on `port` of every interface (0: a free port); the port
/// it got goes to `bound`. -1 on failure, with the reason in `why`.
int listen_any(int port, int* bound, std::string* why);
/// Connects to host:port, retrying every 100 ms (the listener may still be
/// starting) until `deadline`; -1 when it never succeeds, with the last reason
/// in `why`. The socket has TCP_NODELAY.
int connect_until(const std::string& host, int port, std::chrono::steady_clock::time_point deadline,
                  std::string* why);

/// "2.5 s": a wait or deadline, for the messages of the rendezvous.
std::string seconds(std::chrono::milliseconds t);

}  // namespace bt::dist::net
