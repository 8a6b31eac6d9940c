// libFuzzer target: rank 0 of the TCP process group (runtime/dist/tcp_star.h,
// Note [TCP process group]) on the bytes of a hostile rank 1, in a group of
// two. Each input makes a group over a store on localhost and runs one
// collective on rank 0 (its kind, dtype, size and root from the input), while
// a thread plays rank 1: it passes the job token's handshake (the harness
// tcp_store fuzzes the handshake itself), may first open a connection whose
// hello is the input's bytes, connects as rank 1, and sends the rest of the
// input on its data connection -- after the right header for rank 0's
// collective, or as the whole stream -- then closes its sending side and
// takes what rank 0 sends until rank 0 closes the group.
//
// Whatever the bytes, rank 0 must never crash, hang, leak or trip a
// sanitizer: making the group either succeeds or throws bt::Error (only a
// hostile hello may spoil it), and run() either completes or throws a
// bt::Error that names rank 1 (never an internal error). A collective that
// completes has rank 0's own bytes and rank 1's in the results, added in
// dtype's arithmetic, on rank 0 and in what rank 0 sent rank 1 after its
// header (when rank 1 sent no more than rank 0 took), bit for bit.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kernels/common/dtype.h"
#include "kernels/common/error.h"
#include "runtime/dist/auth.h"
#include "runtime/dist/tcp_socket.h"
#include "runtime/dist/tcp_star.h"
#include "runtime/dist/tcp_store.h"
#include "tests/fuzz/fuzz_socket.h"

namespace {

using bt::DType;
using bt::dist::StarCollective;
using bt::dist::TcpStar;
using bt::dist::TcpStore;

// Each process its own job's token: with --jobs, a connection that reaches
// another process's port (ports are reused) is then a stranger there.
const std::string kToken = "fuzz-job-token-" + std::to_string(::getpid()) + "-0123456789abcdef";
constexpr std::chrono::milliseconds kWait{5000};
constexpr int kPeerDoneMs = 8000;        // rank 0 closes the group within this once rank 1 is done
constexpr int kStoreInputs = 4096;       // a fresh store after this many inputs (each group adds a key)
constexpr uint32_t kMagic = 0x42545047;  // tcp_star.cpp's "BTPG"
constexpr DType kDTypes[4] = {DType::F32, DType::F64, DType::I32, DType::I64};

/// tcp_star.cpp's hello: the first bytes on each connection after the handshake.
struct Hello {
  uint32_t magic;
  int32_t rank, channel, pad;
  int64_t gen;
};
static_assert(sizeof(Hello) == 24);

/// A failure of the harness itself (not of rank 0): stop loudly.
[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "fuzz_tcp_star: cannot set up: %s\n", what.c_str());
  std::abort();
}

long g_inputs = 0, g_skipped = 0;  // inputs run, and skipped for want of a port

/// An input skipped because rank 0 could not listen (out of ports): counted
/// and reported every 100; a machine where over 10% are is no place for
/// this harness, so it stops.
void skipped_for_ports() {
  if (++g_skipped % 100 == 0)
    std::fprintf(stderr, "fuzz_tcp_star: %ld of %ld inputs skipped: rank 0 could not listen\n", g_skipped,
                 g_inputs);
  if (g_inputs >= 1000 && g_skipped * 10 > g_inputs)
    die("rank 0 could not listen for over 10% of the inputs");
}

/// A connection to 127.0.0.1:port, or -1 (rank 0 has closed its listener).
int connect_to(int port) { return bt::fuzz::connect_loopback(port); }

/// The store the two ranks meet in: rank 0 serves it; rank 1 asks it over a
/// connection of its own, with the store's requests written out here.
struct Store {
  std::unique_ptr<TcpStore> rank0;
  int rank1 = -1;
  int64_t groups = 0;  // groups made over it so far: rank 0's count, which names the next one's key

  Store() {
    try {
      rank0 = std::make_unique<TcpStore>("127.0.0.1", 0, true, kWait, kToken);
    } catch (const bt::Error& e) {
      die(e.what());
    }
    std::string why;
    rank1 = connect_to(rank0->port());
    if (rank1 < 0 || !bt::dist::auth::join(rank1, kToken, kWait, &why))
      die("rank 1 cannot join the store: " + why);
  }
  ~Store() { ::close(rank1); }

  /// The value of `key`, asked for until rank 0 sets it ("" after kWait).
  std::string wait_for(const std::string& key) {
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    std::string req(1, '\2');  // CHECK
    const auto n = static_cast<uint32_t>(key.size()), none = uint32_t{0};
    req.append(reinterpret_cast<const char*>(&n), sizeof n).append(key);
    req.append(reinterpret_cast<const char*>(&none), sizeof none);
    while (std::chrono::steady_clock::now() < deadline) {
      uint8_t found = 0;
      uint32_t len = 0;
      if (!bt::dist::net::send_all(rank1, req.data(), req.size()) ||
          !bt::dist::net::recv_all(rank1, &found, 1) ||
          (found && !bt::dist::net::recv_all(rank1, &len, sizeof len)))
        die("rank 1 lost the store");
      if (found) {
        std::string v(len, '\0');
        if (!bt::dist::net::recv_all(rank1, v.data(), len)) die("rank 1 lost the store");
        return v;
      }
      std::this_thread::yield();
    }
    return "";
  }
};

/// What the thread playing rank 1 does, and what it saw.
struct Rank1 {
  int64_t gen = 0;
  bool hostile = false;  // first a connection that sends `hello`, then closes its sending side
  std::string hello;
  std::string stream;  // its data connection's bytes after the hello
  std::string got;     // rank 0's bytes on the data connection (the first `keep`)
  size_t keep = 0;
};

/// A connection to rank 0's group that has passed the handshake, or -1.
int join_group(int port) {
  const int fd = connect_to(port);
  std::string why;
  if (fd >= 0 && bt::dist::auth::join(fd, kToken, kWait, &why)) return fd;
  if (fd >= 0) ::close(fd);
  return -1;
}

void play_rank1(Store& store, Rank1& r) {
  const std::string addr = store.wait_for(bt::cat("tcp_pg/", r.gen, "/addr"));
  if (addr.empty()) return;  // rank 0 then fails to make the group: the main thread traps
  const int port = std::atoi(addr.c_str() + addr.rfind(':') + 1);
  int fds[3] = {-1, -1, -1};
  if (r.hostile && (fds[2] = join_group(port)) >= 0) {
    (void)bt::dist::net::send_all(fds[2], r.hello.data(), r.hello.size());
    ::shutdown(fds[2], SHUT_WR);
  }
  for (int channel = 0; channel < 2; ++channel) {
    const Hello h{kMagic, 1, channel, 0, r.gen};
    if ((fds[channel] = join_group(port)) >= 0) (void)bt::dist::net::send_all(fds[channel], &h, sizeof h);
  }
  if (fds[0] >= 0) bt::fuzz::exchange(fds[0], r.stream.data(), r.stream.size(), kPeerDoneMs, &r.got, r.keep);
  for (const int fd : fds)
    if (fd >= 0) ::close(fd);
}

/// a + b element by element in T's arithmetic (Acc: unsigned for integers),
/// as rank 0 adds (rank 0's bytes first).
template <typename T, typename Acc = T>
std::string add(const char* a, const char* b, size_t bytes) {
  std::string out(bytes, '\0');
  for (size_t i = 0; i + sizeof(T) <= bytes; i += sizeof(T)) {
    T x, y;
    std::memcpy(&x, a + i, sizeof x);
    std::memcpy(&y, b + i, sizeof y);
    const T s = static_cast<T>(static_cast<Acc>(x) + static_cast<Acc>(y));
    std::memcpy(out.data() + i, &s, sizeof s);
  }
  return out;
}

std::string sum(DType t, const char* a, const char* b, size_t bytes) {
  switch (t) {
    case DType::F32:
      return add<float>(a, b, bytes);
    case DType::F64:
      return add<double>(a, b, bytes);
    case DType::I32:
      return add<int32_t, uint32_t>(a, b, bytes);
    default:
      return add<int64_t, uint64_t>(a, b, bytes);
  }
}

/// `got` holds `want`'s elements of t bit for bit, but for a NaN, which may
/// come out of a + b with either one's payload.
bool same_result(DType t, const char* got, const std::string& want) {
  const size_t size = bt::dtype_size(t);
  const auto nan = [t](const char* p) {
    float f;
    double d;
    if (t == DType::F32) return std::memcpy(&f, p, sizeof f), std::isnan(f);
    return std::memcpy(&d, p, sizeof d), std::isnan(d);
  };
  for (size_t i = 0; i < want.size(); i += size) {
    const bool floats = t == DType::F32 || t == DType::F64;
    if (floats && nan(got + i) && nan(want.data() + i)) continue;
    if (std::memcmp(got + i, want.data() + i, size) != 0) return false;
  }
  return true;
}

}  // namespace

// The input: byte 0 the collective's kind (1 + b % 5); byte 1 its dtype (bits
// 0-1: f32, f64, i32, i64), broadcast's root (bit 2: rank 1), whether rank 1
// sends the right header before its bytes (bit 3), a hostile hello first
// (bit 4), in-place buffers (bit 5) and, with BT_FUZZ_STAR_LARGE=1, 1 MiB
// more (bits 6 and 7: a second chunk of rank 0's reduction); bytes 2-3
// its element count (little-endian, modulo 513); with bit 4, the next 24
// bytes are that hello, whose gen counts from this group's (1 is right); the
// rest is what rank 1 sends.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::unique_ptr<Store> store;
  if (g_inputs++ % kStoreInputs == 0) {
    store.reset();
    store = std::make_unique<Store>();
  }
  uint8_t head[4] = {};
  const size_t used = std::min<size_t>(size, sizeof head);
  std::memcpy(head, data, used);
  data += used, size -= used;

  StarCollective c;
  c.kind = static_cast<StarCollective::Kind>(1 + head[0] % 5);
  c.dtype = kDTypes[head[1] & 3];
  c.root = c.kind == StarCollective::kBroadcast && (head[1] & 4) ? 1 : 0;
  c.seq = 1;
  c.what = "the fuzzed collective #1";
  const bool header = head[1] & 8, in_place = head[1] & 32;
  // With bits 6 and 7, a second chunk (kChunk in tcp_star.cpp: 1 MiB), rank 1's bytes cycled to fill it:
  // only under BT_FUZZ_STAR_LARGE=1, as such an input takes 20 times as long.
  static const bool allow_large =
      std::getenv("BT_FUZZ_STAR_LARGE") && *std::getenv("BT_FUZZ_STAR_LARGE") == '1';
  const bool large = allow_large && (head[1] & 0xc0) == 0xc0;
  const size_t n =
      c.kind == StarCollective::kBarrier
          ? 0
          : (head[2] | head[3] << 8) % 513 * bt::dtype_size(c.dtype) + (large ? size_t{1} << 20 : 0);
  // How many bytes rank 1 sends after its header: what rank 0 takes in.
  const size_t theirs = c.kind == StarCollective::kReduceScatter              ? 2 * n
                        : c.kind == StarCollective::kBroadcast && c.root == 0 ? 0
                                                                              : n;
  c.n = n;

  Rank1 r;
  r.gen = ++store->groups;
  r.hostile = head[1] & 16;
  if (r.hostile) {
    const size_t h = std::min<size_t>(size, sizeof(Hello));
    r.hello.assign(reinterpret_cast<const char*>(data), h);
    data += h, size -= h;
    if (h == sizeof(Hello)) {
      int64_t gen;
      std::memcpy(&gen, r.hello.data() + offsetof(Hello, gen), sizeof gen);
      gen = static_cast<int64_t>(static_cast<uint64_t>(gen) + static_cast<uint64_t>(r.gen) - 1);
      std::memcpy(r.hello.data() + offsetof(Hello, gen), &gen, sizeof gen);
    }
  }
  const TcpStar::Header mine{kMagic, c.kind, static_cast<uint8_t>(c.dtype), 0, 0, c.root, 0, c.seq, n};
  if (header) r.stream.assign(reinterpret_cast<const char*>(&mine), sizeof mine);
  const std::string rest(reinterpret_cast<const char*>(data), size);
  r.stream.append(rest);
  if (large && r.stream.size() < sizeof mine + theirs) {  // rest, rest, ... (doubling what is there)
    const size_t from = r.stream.size(), need = sizeof mine + theirs;
    r.stream.reserve(need);
    r.stream.append(rest.empty() ? std::string(1, '\0') : rest);
    while (r.stream.size() < need)
      r.stream.append(r.stream, from, std::min(r.stream.size() - from, need - r.stream.size()));
    r.stream.resize(need);
  }
  r.keep = sizeof mine + 2 * n + 8;

  // Rank 0's buffers: its own bytes (a pattern), kept to check against.
  std::vector<char> in(2 * n + 1), out(2 * n + 1);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<char>(i * 7 + 3);
  const std::vector<char> own = in;
  c.in = in.data();
  c.out = c.kind == StarCollective::kReduceScatter || c.kind == StarCollective::kAllGather
              ? (in_place ? in.data() : out.data())
              : nullptr;

  std::thread peer([&] { play_rank1(*store, r); });
  bool ran = false;
  {
    std::unique_ptr<TcpStar> star;
    try {
      star = std::make_unique<TcpStar>(*store->rank0, 0, 2, [](int rank, int64_t) {
        if (rank != 1) __builtin_trap();
      });
    } catch (const bt::InternalError&) {
      __builtin_trap();
    } catch (const bt::Error& e) {
      // Many processes of this harness at once (--jobs) can use up the
      // machine's ephemeral ports (each input's connections linger in
      // TIME_WAIT for a minute): a listen that fails then is the machine's
      // limit, not a finding, so the input is skipped.
      if (std::strstr(e.what(), "cannot listen") != nullptr) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        skipped_for_ports();
      } else if (!r.hostile) {  // a group of well-behaved hellos must form
        std::fprintf(stderr, "fuzz_tcp_star: the group did not form: %s\n", e.what());
        __builtin_trap();
      }
    }
    if (star) {
      try {
        star->run(c);
        ran = true;
      } catch (const bt::InternalError&) {
        __builtin_trap();
      } catch (const bt::Error& e) {
        if (std::strstr(e.what(), "rank 1") == nullptr) __builtin_trap();
        star->tell_peers(e.what());
      }
    }
  }  // rank 0 closes the group: rank 1's thread ends
  peer.join();
  if (!ran) return 0;

  // It completed: rank 1 sent a header like rank 0's and then its bytes.
  if (r.stream.size() < sizeof mine + theirs) __builtin_trap();
  const char* peer_bytes = r.stream.data() + sizeof mine;
  std::string result, to_rank1;  // rank 0's result, and what it must have sent rank 1 after its header
  switch (c.kind) {
    case StarCollective::kAllReduce:
      result = to_rank1 = sum(c.dtype, own.data(), peer_bytes, n);
      if (!same_result(c.dtype, c.in, result)) __builtin_trap();
      break;
    case StarCollective::kReduceScatter:
      result = sum(c.dtype, own.data(), peer_bytes, n);
      to_rank1 = sum(c.dtype, own.data() + n, peer_bytes + n, n);
      if (!same_result(c.dtype, c.out, result)) __builtin_trap();
      break;
    case StarCollective::kAllGather:
      result.assign(own.data(), n);
      to_rank1 = result;
      result.append(peer_bytes, n);
      if (!same_result(c.dtype, c.out, result)) __builtin_trap();
      break;
    case StarCollective::kBroadcast:
      result.assign(c.root == 0 ? own.data() : peer_bytes, n);
      if (c.root == 0) to_rank1 = result;
      if (!same_result(c.dtype, c.in, result)) __builtin_trap();
      break;
    case StarCollective::kBarrier:
      to_rank1.assign(reinterpret_cast<const char*>(&c.seq), sizeof c.seq);
      break;
  }
  // Rank 1 has all of it, unless it sent more than rank 0 took: rank 0's
  // close then resets the connection, and rank 1 may lose the end.
  if (r.stream.size() > sizeof mine + theirs) return 0;
  if (r.got.size() < sizeof mine + to_rank1.size() || std::memcmp(r.got.data(), &mine, sizeof mine) != 0 ||
      !same_result(c.dtype, r.got.data() + sizeof mine, to_rank1))
    __builtin_trap();
  return 0;
}
