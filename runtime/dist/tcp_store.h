// TcpStore: a small key-value store over TCP, the rendezvous of jobs started
// without MPI (torchrun-style variables; Kubernetes Indexed Jobs). Rank 0
// serves it on MASTER_ADDR:MASTER_PORT from a background thread; every rank,
// rank 0 included, is a client.
//
// Protocol (one request, one reply, on a persistent connection):
//   request  u8 op, u32 key length, key, u32 value length, value
//   reply    SET: u8 1 | CHECK: u8 found, then u32 length + value if found |
//            ADD: i64 new value (the value is a decimal integer)
// Waiting for a key is the client polling CHECK until its deadline, and the
// server reads and writes every socket without waiting on it, so no client
// holds up another. Every connection starts with the job
// token's handshake (Note [Authenticated rendezvous] in auth.cpp): a peer
// that does not prove the token is dropped and named in rank 0's log, and the
// store goes on serving the job.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <thread>

namespace bt::dist {

class TcpStore {
 public:
  /// Connects to host:port (retrying until `timeout`); with `serve`, first
  /// listens on port (all interfaces; 0 picks a free port, see port()).
  /// `token`: the job's secret, which every connection must prove; empty for
  /// none (dist.insecure), which rank 0 and every rank must agree on. Throws
  /// bt::Error naming host:port when it cannot listen or connect, or when the
  /// server does not accept the token.
  TcpStore(const std::string& host, int port, bool serve, std::chrono::milliseconds timeout,
           std::string token);
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::string& value);
  /// The value of `key`, waiting for it to be set; throws bt::Error naming the
  /// key after the timeout.
  std::string get(const std::string& key);
  /// Adds `delta` to the integer at `key` (0 if unset); returns the new value.
  int64_t add(const std::string& key, int64_t delta);
  /// The port served or connected to.
  int port() const { return port_; }
  /// The host connected to (MASTER_ADDR): where every rank reaches rank 0.
  const std::string& host() const { return host_; }
  /// How long get() and the connection wait.
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// The job token connections prove (empty: none); the TCP process group
  /// asks its peers for the same.
  const std::string& token() const { return token_; }

 private:
  std::string request(uint8_t op, const std::string& key, const std::string& value);
  void serve_loop();  // Note [A store that never waits on one client] in tcp_store.cpp
  bool serve(uint8_t op, const std::string& key, const std::string& value, std::string* reply);
  void shutdown();  // closes the connection, stops and joins the server

  std::string host_;
  int port_ = 0;
  std::chrono::milliseconds timeout_;
  std::string token_;
  int listen_fd_ = -1, fd_ = -1, wake_[2] = {-1, -1};
  std::thread server_;
  std::map<std::string, std::string> data_;  // the server's table (server thread only)
};

}  // namespace bt::dist
