// TcpStar: one rank's connections in a TcpProcessGroup, and how each
// collective's bytes move over them: every rank talks to rank 0, which
// reduces (Note [TCP process group] in tcp_process_group.cpp). Only the
// group's worker thread uses it, except stop().
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "kernels/common/dtype.h"
#include "runtime/dist/process_group.h"

namespace bt::dist {

class TcpStore;

/// One collective as the star moves it: byte ranges of the caller's tensors.
struct StarCollective {
  enum Kind : uint8_t { kAllReduce = 1, kReduceScatter, kAllGather, kBroadcast, kBarrier };
  Kind kind = kBarrier;
  DType dtype = DType::U8;
  ReduceOp reduce = ReduceOp::Sum;  // the sum only: Avg divides afterwards, on the caller's thread
  int root = 0;
  int64_t seq = 0;
  std::string what;     // "all_reduce #7 (step 3)"
  char* in = nullptr;   // all_reduce, broadcast: the tensor; reduce_scatter: size * n bytes; all_gather: n
  char* out = nullptr;  // reduce_scatter: n bytes; all_gather: size * n
  size_t n = 0;         // bytes of one rank's slot (the whole tensor for all_reduce and broadcast)
};

class TcpStar {
 public:
  /// Thrown by run() once stop() was called.
  struct Stopped {};

  /// Connects the ranks (see TcpProcessGroup's constructor). `arrived(r, seq)`
  /// is called as rank r's header for collective #seq comes in.
  TcpStar(TcpStore& store, int rank, int size, std::function<void(int, int64_t)> arrived);
  ~TcpStar();
  TcpStar(const TcpStar&) = delete;
  TcpStar& operator=(const TcpStar&) = delete;

  /// Moves (on rank 0: receives, reduces and sends back) one collective.
  /// Throws bt::Error naming a rank that disappeared or issued another
  /// collective; the star is then unusable.
  void run(const StarCollective& c);
  /// Rank 0, after run() failed: passes the message to every other rank, whose
  /// run() then fails with it instead of waiting (best effort).
  void tell_peers(const std::string& msg);
  /// Any thread: a run() in progress, and every later one, throws Stopped.
  void stop();

  /// What each collective starts with, in both directions.
  struct Header {
    uint32_t magic;
    uint8_t kind, dtype, reduce, pad;
    int32_t root, pad2;
    int64_t seq;
    uint64_t n;
  };

 private:
  struct Seg {
    char* p;
    size_t n;
    bool header;
  };
  struct Link {  // the connection to one peer: rank 0's to each rank, each rank's to rank 0
    int rank = -1;
    int data = -1, ctrl = -1;  // ctrl carries only rank 0's error message
    std::deque<Seg> out, in;   // pending sends and receives, in stream order
    uint64_t sent = 0;         // send segments completed so far
    Header got{};              // the peer's header of the current collective
    int64_t token = 0;         // a barrier's release, from rank 0
  };

  void close_all();
  void accept_peers(TcpStore& store, const std::string& key, int64_t gen);
  void connect_to_root(TcpStore& store, const std::string& key, int64_t gen);
  Link& link(int r) { return rank_ == 0 ? links_[static_cast<size_t>(r - 1)] : links_[0]; }
  void post_out(int r, const void* p, size_t n);
  void post_in(int r, void* p, size_t n, bool header = false);
  bool received() const;
  bool sent() const;
  /// Moves bytes on every link until done() (or throws).
  void pump(const std::function<bool()>& done);
  void receive(Link& l);
  void transmit(Link& l);
  void on_header(Link& l);
  /// Rank 0's error message, when one has come on ctrl within wait_ms (it throws).
  void read_ctrl(int wait_ms);
  [[noreturn]] void lost(const Link& l, const std::string& why);
  void hub(const StarCollective& c);
  void hub_reduce(const StarCollective& c);
  void spoke(const StarCollective& c);

  int rank_, size_;
  std::function<void(int, int64_t)> arrived_;
  std::vector<Link> links_;
  int wake_[2] = {-1, -1};
  bool ctrl_open_ = true;
  Header mine_{};
  std::string what_;
  std::vector<char> scratch_, spare_[2];  // rank 0's receive and send buffers (one chunk each)
};

}  // namespace bt::dist
