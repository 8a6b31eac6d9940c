#include "runtime/dist/tcp_star.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/dist/auth.h"
#include "runtime/dist/tcp_socket.h"
#include "runtime/dist/tcp_store.h"

namespace bt::dist {
namespace {

constexpr uint32_t kMagic = 0x42545047;     // "BTPG"
constexpr size_t kChunk = size_t{1} << 20;  // rank 0 reduces (and forwards) 1 MiB at a time

/// The first bytes on each connection: who connects, and for which group.
struct Hello {
  uint32_t magic;
  int32_t rank, channel;  // channel 0: data, 1: ctrl
  int32_t pad;
  int64_t gen;  // the connecting rank's count of groups made so far
};

const char* kind_name(uint8_t k) {
  switch (k) {
    case StarCollective::kAllReduce:
      return "all_reduce";
    case StarCollective::kReduceScatter:
      return "reduce_scatter";
    case StarCollective::kAllGather:
      return "all_gather";
    case StarCollective::kBroadcast:
      return "broadcast";
    case StarCollective::kBarrier:
      return "barrier";
  }
  return "an unknown collective";
}

std::string header_str(const TcpStar::Header& h) {
  std::string s = cat(kind_name(h.kind), " #", h.seq);
  if (h.kind == StarCollective::kBarrier) return s;
  s += cat(" of ", h.n, " bytes of ", static_cast<DType>(h.dtype));
  if (h.kind == StarCollective::kBroadcast) s += cat(" from rank ", h.root);
  return s;
}

bool same(const TcpStar::Header& a, const TcpStar::Header& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.reduce == b.reduce && a.root == b.root &&
         a.seq == b.seq && a.n == b.n;
}

/// dst = own + rows[0] + rows[1] + ..., added in that order (rank order) in
/// T's arithmetic (Acc: unsigned for integers, so that overflow wraps as in MPI).
template <typename T, typename Acc = T>
void add_rows(char* dst, const char* own, const char* rows, size_t stride, int nrows, size_t count) {
  T* d = reinterpret_cast<T*>(dst);
  const T* a = reinterpret_cast<const T*>(own);
  const T* x = reinterpret_cast<const T*>(rows);
  for (size_t i = 0; i < count; ++i) d[i] = static_cast<T>(static_cast<Acc>(a[i]) + static_cast<Acc>(x[i]));
  for (int r = 1; r < nrows; ++r) {
    x = reinterpret_cast<const T*>(rows + static_cast<size_t>(r) * stride);
    for (size_t i = 0; i < count; ++i) d[i] = static_cast<T>(static_cast<Acc>(d[i]) + static_cast<Acc>(x[i]));
  }
}

void sum(DType t, char* dst, const char* own, const char* rows, size_t stride, int nrows, size_t bytes) {
  const size_t count = bytes / dtype_size(t);
  switch (t) {
    case DType::F32:
      return add_rows<float>(dst, own, rows, stride, nrows, count);
    case DType::F64:
      return add_rows<double>(dst, own, rows, stride, nrows, count);
    case DType::I32:
      return add_rows<int32_t, uint32_t>(dst, own, rows, stride, nrows, count);
    case DType::I64:
      return add_rows<int64_t, uint64_t>(dst, own, rows, stride, nrows, count);
    default:
      BT_ASSERT(false, "the tcp group cannot reduce ", t);
  }
}

const char* kReach =
    "; check that every rank runs and that rank 0 accepts connections on any port of MASTER_ADDR (the "
    "CPU process group listens on a free port beside MASTER_PORT: a firewall or Kubernetes NetworkPolicy "
    "must allow it)";

}  // namespace

TcpStar::TcpStar(TcpStore& store, int rank, int size, std::function<void(int, int64_t)> arrived)
    : rank_(rank), size_(size), arrived_(std::move(arrived)) {
  BT_CHECK(::pipe2(wake_, O_CLOEXEC) == 0, "tcp process group: pipe() failed: ", std::strerror(errno));
  if (size_ == 1) return;
  links_.resize(rank_ == 0 ? static_cast<size_t>(size_ - 1) : 1);
  for (size_t i = 0; i < links_.size(); ++i) links_[i].rank = rank_ == 0 ? static_cast<int>(i) + 1 : 0;
  // Every rank counts its groups, so the ranks' n-th groups meet under one key.
  const int64_t gen = store.add(cat("tcp_pg/rank", rank_, "/groups"), 1);
  const std::string key = cat("tcp_pg/", gen, "/addr");
  try {
    if (rank_ == 0)
      accept_peers(store, key, gen);
    else
      connect_to_root(store, key, gen);
  } catch (...) {
    close_all();  // the destructor does not run when the constructor throws
    throw;
  }
}

TcpStar::~TcpStar() { close_all(); }

void TcpStar::close_all() {
  for (Link& l : links_)
    for (int* f : {&l.data, &l.ctrl})
      if (*f >= 0) ::close(*f), *f = -1;
  for (int* f : {&wake_[0], &wake_[1]})
    if (*f >= 0) ::close(*f), *f = -1;
}

void TcpStar::accept_peers(TcpStore& store, const std::string& key, int64_t gen) {
  int port = 0;
  std::string why;
  const int lfd = net::listen_any(0, &port, &why);
  BT_CHECK(lfd >= 0, "tcp process group: rank 0 cannot listen for the other ranks: ", why);
  const std::string addr = cat(store.host(), ":", port);
  const auto deadline = std::chrono::steady_clock::now() + store.timeout();
  int pending = 2 * (size_ - 1);  // a data and a ctrl connection per rank
  try {
    store.set(key, addr);
    while (pending > 0) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{lfd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000))) <= 0) continue;
      const int c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      // A rank proves the job token and sends its hello as soon as it
      // connects; a stranger that says nothing within a second, or the wrong
      // thing, is dropped and named (Note [Authenticated rendezvous]).
      timeval tv{1, 0};
      ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      std::string why;
      Hello h{};
      if (!auth::accept_peer(c, store.token(), std::chrono::seconds(1), &why)) {
      } else if (!net::recv_all(c, &h, sizeof h) || h.magic != kMagic || h.rank < 1 || h.rank >= size_ ||
                 h.channel < 0 || h.channel > 1) {
        why = "it proved the job token but sent no valid hello";
      }
      if (!why.empty()) {
        std::fprintf(stderr, "tcp process group: rank 0 refused a connection from %s: %s\n",
                     auth::peer_of(c).c_str(), why.c_str());
        ::close(c);
        continue;
      }
      tv = timeval{0, 0};
      ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      const int one = 1;
      ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      int& slot = h.channel == 0 ? link(h.rank).data : link(h.rank).ctrl;
      if (slot >= 0 || h.gen != gen) ::close(c);
      BT_CHECK(h.gen == gen, "tcp process group: rank ", h.rank, " connected for its process group #", h.gen,
               " while rank 0 makes its #", gen, "; every rank must create its groups in the same order");
      BT_CHECK(slot < 0, "tcp process group: two processes connected as rank ", h.rank,
               "; give every rank its own RANK");
      slot = c;
      --pending;
    }
  } catch (...) {
    ::close(lfd);
    throw;
  }
  ::close(lfd);
  if (pending == 0) return;
  std::string missing;
  for (const Link& l : links_)
    if (l.data < 0 || l.ctrl < 0) missing += cat(missing.empty() ? "" : ", ", l.rank);
  BT_FAIL("tcp process group: rank(s) ", missing, " did not connect to rank 0 at ", addr, " within ",
          net::seconds(store.timeout()), " (BT_RENDEZVOUS_TIMEOUT_S)", kReach);
}

void TcpStar::connect_to_root(TcpStore& store, const std::string& key, int64_t gen) {
  const std::string addr = store.get(key);
  const size_t colon = addr.rfind(':');
  BT_ASSERT(colon != std::string::npos, "bad address '", addr, "' in the store");
  const std::string host = addr.substr(0, colon);
  const int port = std::stoi(addr.substr(colon + 1));
  const auto deadline = std::chrono::steady_clock::now() + store.timeout();
  Link& l = links_[0];
  for (int channel = 0; channel < 2; ++channel) {
    std::string why;
    const int fd = net::connect_until(host, port, deadline, &why);
    BT_CHECK(fd >= 0, "tcp process group: rank ", rank_, " cannot connect to rank 0 at ", addr, " within ",
             net::seconds(store.timeout()), " (", why, ")", kReach);
    (channel == 0 ? l.data : l.ctrl) = fd;
    BT_CHECK(auth::join(fd, store.token(),
                        std::min<std::chrono::milliseconds>(store.timeout(), std::chrono::seconds(10)), &why),
             "tcp process group: rank 0 at ", addr, " did not let rank ", rank_, " in: ", why);
    const Hello h{kMagic, rank_, channel, 0, gen};
    BT_CHECK(net::send_all(fd, &h, sizeof h), "tcp process group: rank 0 at ", addr,
             " closed the connection at once", kReach);
  }
}

void TcpStar::stop() {
  const char c = 'x';
  (void)!::write(wake_[1], &c, 1);
}

void TcpStar::tell_peers(const std::string& msg) {
  const auto n = static_cast<uint32_t>(std::min<size_t>(msg.size(), 60000));
  std::string frame(reinterpret_cast<const char*>(&n), sizeof n);
  frame.append(msg, 0, n);
  for (Link& l : links_)
    if (l.ctrl >= 0) (void)!::send(l.ctrl, frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

void TcpStar::post_out(int r, const void* p, size_t n) {
  if (n > 0) link(r).out.push_back({static_cast<char*>(const_cast<void*>(p)), n, false});
}

void TcpStar::post_in(int r, void* p, size_t n, bool header) {
  if (n > 0) link(r).in.push_back({static_cast<char*>(p), n, header});
}

bool TcpStar::received() const {
  return std::all_of(links_.begin(), links_.end(), [](const Link& l) { return l.in.empty(); });
}

bool TcpStar::sent() const {
  return std::all_of(links_.begin(), links_.end(), [](const Link& l) { return l.out.empty(); });
}

void TcpStar::pump(const std::function<bool()>& done) {
  std::vector<pollfd> fds;
  std::vector<Link*> who;
  while (!done()) {
    fds.assign(1, pollfd{wake_[0], POLLIN, 0});
    const bool watch_ctrl = rank_ != 0 && ctrl_open_;
    if (watch_ctrl) fds.push_back({links_[0].ctrl, POLLIN, 0});
    const size_t first = fds.size();
    who.clear();
    for (Link& l : links_) {
      if (l.in.empty() && l.out.empty()) continue;
      const int ev = (l.in.empty() ? 0 : POLLIN) | (l.out.empty() ? 0 : POLLOUT) | POLLRDHUP;
      fds.push_back({l.data, static_cast<short>(ev), 0});
      who.push_back(&l);
    }
    BT_ASSERT(!who.empty(), "a collective waits with nothing to move");
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      BT_CHECK(errno == EINTR, "tcp process group: poll() failed during ", what_, ": ", std::strerror(errno));
      continue;
    }
    if (fds[0].revents) throw Stopped{};
    if (watch_ctrl && fds[1].revents) read_ctrl(0);
    for (size_t i = first; i < fds.size(); ++i) {
      const short ev = fds[i].revents;
      Link& l = *who[i - first];
      if (!ev) continue;
      // Sends first: a rank's header leaves before it judges rank 0's (on_header).
      if (!l.out.empty() && (ev & (POLLOUT | POLLERR | POLLHUP))) transmit(l);
      if (!l.in.empty()) receive(l);
      // Nothing more to read but bytes to send, and the peer has closed: it is
      // gone (a rank ends only after taking every byte of its collectives).
      if (l.in.empty() && !l.out.empty() && (ev & (POLLRDHUP | POLLHUP | POLLERR)))
        lost(l, "its connection closed");
    }
  }
}

void TcpStar::receive(Link& l) {
  while (!l.in.empty()) {
    Seg& s = l.in.front();
    const ssize_t r = ::recv(l.data, s.p, s.n, MSG_DONTWAIT);
    if (r > 0) {
      s.p += r;
      s.n -= static_cast<size_t>(r);
      if (s.n > 0) continue;
      const bool header = s.header;
      l.in.pop_front();
      if (header) on_header(l);  // before any byte lands in the caller's tensors
      continue;
    }
    if (r == 0) lost(l, "its connection closed");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    lost(l, std::strerror(errno));
  }
}

void TcpStar::transmit(Link& l) {
  while (!l.out.empty()) {
    Seg& s = l.out.front();
    const ssize_t w = ::send(l.data, s.p, s.n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w > 0) {
      s.p += w;
      s.n -= static_cast<size_t>(w);
      if (s.n == 0) l.out.pop_front(), ++l.sent;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    lost(l, w < 0 ? std::strerror(errno) : "send() sent nothing");
  }
}

void TcpStar::on_header(Link& l) {
  const Header& h = l.got;
  BT_CHECK(h.magic == kMagic, "tcp process group: rank ", l.rank,
           " sent bytes that are not a collective's "
           "header during ",
           what_, "; the ranks' collectives disagree in size (a bug in the caller)");
  arrived_(l.rank, h.seq);
  if (same(h, mine_)) return;
  const std::string msg =
      cat("collectives differ across ranks: rank ", l.rank, " issued ", header_str(h), " while rank ", rank_,
          " issued ", header_str(mine_),
          "; every rank must issue the same collectives in the same order, with the same dtype and size");
  // Rank 0 finds the same in this rank's header (sent already): wait a moment
  // for its message, so that every rank reports rank 0's view.
  if (rank_ != 0) read_ctrl(1000);
  BT_FAIL(msg);
}

void TcpStar::read_ctrl(int wait_ms) {
  pollfd p{links_[0].ctrl, POLLIN, 0};
  if (!ctrl_open_ || ::poll(&p, 1, wait_ms) <= 0) return;
  uint32_t n = 0;
  std::string msg;
  if (net::recv_all(p.fd, &n, sizeof n) && n <= 60000) {
    msg.resize(n);
    if (net::recv_all(p.fd, msg.data(), n)) BT_FAIL(what_, " failed on rank 0: ", msg);
  }
  ctrl_open_ = false;  // rank 0 closed its group (its data connection tells whether too early)
}

void TcpStar::lost(const Link& l, const std::string& why) {
  if (rank_ != 0) read_ctrl(200);  // rank 0 may have said why it left
  BT_FAIL("rank ", l.rank, " disappeared during ", what_, " (", why, " on rank ", rank_,
          "): it crashed, was killed or closed its process group early; its log says why");
}

void TcpStar::run(const StarCollective& c) {
  what_ = c.what;
  mine_ = Header{kMagic, c.kind, static_cast<uint8_t>(c.dtype), static_cast<uint8_t>(c.reduce), 0, c.root, 0,
                 c.seq,  c.n};
  if (size_ > 1) return rank_ == 0 ? hub(c) : spoke(c);
  // One rank: only the copies of the out-of-place forms.
  if ((c.kind == StarCollective::kReduceScatter || c.kind == StarCollective::kAllGather) && c.in != c.out &&
      c.n > 0)
    std::memcpy(c.out, c.in, c.n);
}

void TcpStar::hub(const StarCollective& c) {
  for (int p = 1; p < size_; ++p) {
    post_out(p, &mine_, sizeof mine_);
    post_in(p, &link(p).got, sizeof(Header), true);
  }
  pump([this] { return received(); });
  switch (c.kind) {
    case StarCollective::kAllReduce:
    case StarCollective::kReduceScatter:
      hub_reduce(c);
      break;
    case StarCollective::kAllGather:
      if (c.in != c.out && c.n > 0) std::memcpy(c.out, c.in, c.n);  // rank 0's slot
      for (int p = 1; p < size_; ++p) post_in(p, c.out + p * c.n, c.n);
      pump([this] { return received(); });
      for (int p = 1; p < size_; ++p) {  // every slot but the peer's own
        post_out(p, c.out, p * c.n);
        post_out(p, c.out + (p + 1) * c.n, (size_ - p - 1) * c.n);
      }
      break;
    case StarCollective::kBroadcast:
      if (c.root != 0) {
        post_in(c.root, c.in, c.n);
        pump([this] { return received(); });
      }
      for (int p = 1; p < size_; ++p)
        if (p != c.root) post_out(p, c.in, c.n);
      break;
    case StarCollective::kBarrier:
      for (int p = 1; p < size_; ++p) post_out(p, &mine_.seq, sizeof mine_.seq);  // "everyone arrived"
      break;
  }
  pump([this] { return sent(); });
}

void TcpStar::hub_reduce(const StarCollective& c) {
  const bool scatter = c.kind == StarCollective::kReduceScatter;
  const size_t chunk = std::min(kChunk, c.n);  // kChunk is a multiple of every element size
  if (chunk == 0) return;
  scratch_.resize(static_cast<size_t>(size_ - 1) * chunk);
  if (scatter)
    for (auto& s : spare_) s.resize(chunk);
  // reduce_scatter's results for other ranks go out of two spare buffers in
  // turn: a buffer is reused once its send (ticket: the link's send count) is done.
  uint64_t ticket[2] = {0, 0};
  int owner[2] = {1, 1}, b = 0;
  for (int q = 0; q < (scatter ? size_ : 1); ++q) {
    for (size_t off = 0; off < c.n; off += chunk) {
      const size_t len = std::min(chunk, c.n - off);
      for (int p = 1; p < size_; ++p) post_in(p, scratch_.data() + static_cast<size_t>(p - 1) * chunk, len);
      pump([this] { return received(); });
      char* dst = c.in + off;  // all_reduce: in place
      if (scatter && q == 0) {
        dst = c.out + off;
      } else if (scatter) {
        const Link& o = link(owner[b]);
        const uint64_t t = ticket[b];
        pump([&o, t] { return o.sent >= t; });
        dst = spare_[b].data();
      }
      sum(c.dtype, dst, c.in + q * c.n + off, scratch_.data(), chunk, size_ - 1, len);
      if (!scatter) {
        for (int p = 1; p < size_; ++p) post_out(p, dst, len);
      } else if (q > 0) {
        post_out(q, dst, len);
        owner[b] = q;
        ticket[b] = link(q).sent + link(q).out.size();
        b ^= 1;
      }
    }
  }
}

void TcpStar::spoke(const StarCollective& c) {
  const size_t n = c.n, r = static_cast<size_t>(rank_);
  post_out(0, &mine_, sizeof mine_);
  post_in(0, &links_[0].got, sizeof(Header), true);
  // Receiving into the buffer being sent is safe: rank 0 sends a result byte
  // only after it has every rank's bytes up to there.
  switch (c.kind) {
    case StarCollective::kAllReduce:
      post_out(0, c.in, n);
      post_in(0, c.in, n);
      break;
    case StarCollective::kReduceScatter:
      post_out(0, c.in, static_cast<size_t>(size_) * n);
      post_in(0, c.out, n);
      break;
    case StarCollective::kAllGather: {
      char* slot = c.out + r * n;
      if (c.in != slot && n > 0) std::memcpy(slot, c.in, n);
      post_out(0, c.in, n);
      post_in(0, c.out, r * n);
      post_in(0, slot + n, (static_cast<size_t>(size_) - r - 1) * n);
      break;
    }
    case StarCollective::kBroadcast:
      if (c.root == rank_)
        post_out(0, c.in, n);
      else
        post_in(0, c.in, n);
      break;
    case StarCollective::kBarrier:
      post_in(0, &links_[0].token, sizeof links_[0].token);  // rank 0's word that everyone arrived
      break;
  }
  pump([this] { return received() && sent(); });
}

}  // namespace bt::dist
