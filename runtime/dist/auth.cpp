#include "runtime/dist/auth.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>

#include "kernels/common/error.h"
#include "runtime/core/printable.h"
#include "runtime/dist/tcp_socket.h"

namespace bt::dist::auth {

// Note [Authenticated rendezvous]
// A job started with torchrun-style variables listens on two kinds of TCP
// port: rank 0's store (MASTER_PORT) and rank 0's CPU process group (a free
// port it posts in the store). Whoever can reach them could otherwise claim a
// rank, read the NCCL unique id, or feed a collective. So every connection
// to either starts with a challenge-response on the job token, a secret every
// rank has (BT_JOB_TOKEN or BT_JOB_TOKEN_FILE) and the network never carries:
//
//   rank 0 -> peer   "BTAUTH1\n" mode Ns      mode 1; Ns: 32 fresh random bytes
//   peer -> rank 0   "BTAUTH1\n" Nc Mc        Mc = HMAC-SHA-256(token, "bt-peer" 0 Ns Nc)
//   rank 0 -> peer   Ms                       Ms = HMAC-SHA-256(token, "bt-rank0" 0 Nc Ns)
//
// Rank 0 drops a peer whose Mc is wrong, who sends something else, or who
// sends nothing within a second, names it in its log (address and what it
// sent) and goes on serving the job. The second bounds the whole proof, not
// each byte of it, so a stranger trickling bytes holds rank 0 no longer. A recorded exchange is useless: the
// next connection gets another Ns, so an old Mc does not fit it (a replay). The peer checks Ms in turn, so a
// process that took over rank 0's address without the token cannot pose as rank 0. The two MACs differ in
// their label and nonce order, so neither side's proof can be reflected back as the other's. The comparison
// takes the same time wherever the bytes differ. A job without a token (dist.insecure: true) still sends the
// greeting, with mode 0 and no proof asked: so a rank whose setting differs from rank 0's learns it at once,
// from either side, instead of misreading the bytes.
//
// What it does not do: encrypt. After the handshake the bytes (keys, values,
// tensors) cross the network in clear, and a machine on the path could
// change them; run jobs on a network only they and their storage use. NCCL's
// own bootstrap and transport are unauthenticated too (docs/distributed.md).
//
// SHA-256 is written here (FIPS 180-4, checked against its test vectors in
// tests/runtime/dist/test_auth.cpp) because no library the project builds
// with provides it on every machine it runs on: OpenSSL is not on the GPU
// image.

namespace {

constexpr char kMagic[8] = {'B', 'T', 'A', 'U', 'T', 'H', '1', '\n'};

constexpr uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

class Sha256 {
 public:
  void update(std::string_view d) {
    for (const char c : d) {
      block_[used_++] = static_cast<uint8_t>(c);
      if (used_ == 64) compress(), used_ = 0;
    }
    bits_ += 8 * static_cast<uint64_t>(d.size());
  }
  Digest finish() {
    const uint64_t bits = bits_;
    update(std::string_view("\x80", 1));
    while (used_ != 56) update(std::string_view("\0", 1));
    for (int i = 7; i >= 0; --i) block_[used_++] = static_cast<uint8_t>(bits >> (8 * i));
    compress();
    Digest out;
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 4; ++j) out[4 * i + j] = static_cast<uint8_t>(h_[i] >> (24 - 8 * j));
    return out;
  }

 private:
  void compress() {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = (uint32_t{block_[4 * i]} << 24) | (uint32_t{block_[4 * i + 1]} << 16) |
             (uint32_t{block_[4 * i + 2]} << 8) | block_[4 * i + 3];
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kK[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    const uint32_t v[8] = {a, b, c, d, e, f, g, h};
    for (int i = 0; i < 8; ++i) h_[i] += v[i];
  }

  uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  uint8_t block_[64] = {};
  size_t used_ = 0;
  uint64_t bits_ = 0;
};

std::string_view view(const std::array<uint8_t, 32>& a) {
  return {reinterpret_cast<const char*>(a.data()), a.size()};
}

/// The MAC one side sends: HMAC(token, label 0 first second).
Digest mac(const std::string& token, const char* label, const Nonce& first, const Nonce& second) {
  std::string m(label);
  m.push_back('\0');
  m.append(view(first));
  m.append(view(second));
  return hmac_sha256(token, m);
}

/// What a peer sent, for the log: its first 40 bytes, quoted and printable.
std::string shown(const char* p, size_t n) { return "'" + printable(std::string_view(p, n), 40) + "'"; }

/// Receives up to `n` bytes within `wait` in all (fewer at end of stream or
/// when the time is up), however the peer spaces them out: a peer that sends
/// one byte a second cannot hold rank 0 longer than `wait`. How many came;
/// `closed`: whether the stream ended or failed (rather than timing out).
size_t receive_within(int fd, char* p, size_t n, std::chrono::milliseconds wait, bool* closed = nullptr) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  size_t got = 0;
  if (closed) *closed = false;
  while (got < n) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now())
            .count();
    if (left <= 0) break;
    pollfd pfd{fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;  // the time is up (or poll failed)
    const ssize_t r = ::recv(fd, p + got, n - got, MSG_DONTWAIT);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) {
      continue;
    } else {
      if (closed) *closed = true;  // end of stream, or a reset
      break;
    }
  }
  return got;
}

}  // namespace

Digest sha256(std::string_view data) {
  Sha256 s;
  s.update(data);
  return s.finish();
}

Digest hmac_sha256(std::string_view key, std::string_view message) {
  std::string k(key);
  if (k.size() > 64) {
    const Digest d = sha256(k);
    k.assign(reinterpret_cast<const char*>(d.data()), d.size());
  }
  k.resize(64, '\0');
  std::string inner(64, '\0'), outer(64, '\0');
  for (size_t i = 0; i < 64; ++i) {
    inner[i] = static_cast<char>(k[i] ^ 0x36);
    outer[i] = static_cast<char>(k[i] ^ 0x5c);
  }
  Sha256 in;
  in.update(inner);
  in.update(message);
  const Digest ih = in.finish();
  Sha256 out;
  out.update(outer);
  out.update(view(ih));
  return out.finish();
}

bool same_digest(const Digest& a, const Digest& b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(out.data() + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    BT_CHECK(r > 0, "cannot read random bytes (getrandom): ", std::strerror(errno));
    got += static_cast<size_t>(r);
  }
  return out;
}

std::string hex(std::string_view bytes) {
  static constexpr const char* kDigits = "0123456789abcdef";
  std::string s;
  for (const char c : bytes) {
    const auto u = static_cast<unsigned char>(c);
    s.push_back(kDigits[u >> 4]);
    s.push_back(kDigits[u & 15]);
  }
  return s;
}

std::string new_token() { return hex(random_bytes(32)); }

std::optional<std::string> job_token() {
  std::string token, from;
  if (const char* v = std::getenv("BT_JOB_TOKEN"); v && *v) {
    token = v;
    from = "BT_JOB_TOKEN";
  } else if (const char* f = std::getenv("BT_JOB_TOKEN_FILE"); f && *f) {
    std::ifstream in(f, std::ios::binary);
    BT_CHECK(in.good(), "BT_JOB_TOKEN_FILE=", f, ": cannot read the file: ", std::strerror(errno),
             "; point it at a file holding the job's token");
    std::ostringstream ss;
    ss << in.rdbuf();
    token = ss.str();
    const char* space = " \t\r\n";
    token.erase(0, token.find_first_not_of(space) == std::string::npos ? token.size()
                                                                       : token.find_first_not_of(space));
    token.erase(token.find_last_not_of(space) + 1);
    from = cat("BT_JOB_TOKEN_FILE (", f, ")");
  } else {
    return std::nullopt;
  }
  BT_CHECK(token.size() >= 16, from, " holds a token of ", token.size(),
           " characters; use at least 16 random ones, e.g. `blutrain launch` makes 64 hexadecimal ones");
  return token;
}

std::string peer_of(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "an unknown address";
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
  }
  return cat(host, ":", port);
}

bool greet(int fd, bool token, Nonce* sent) {
  *sent = Nonce{};
  if (token) {
    const std::string r = random_bytes(sent->size());
    std::memcpy(sent->data(), r.data(), sent->size());
  }
  std::string msg(kMagic, sizeof kMagic);
  msg.push_back(token ? '\1' : '\0');
  msg.append(view(*sent));
  return net::send_all(fd, msg.data(), msg.size());
}

size_t answer_size() { return sizeof kMagic + 64; }

std::string incomplete_answer(std::string_view got, bool closed, std::chrono::milliseconds wait) {
  if (got.empty())
    return closed ? std::string("it closed the connection without a proof of the job token")
                  : cat("it sent nothing within ", net::seconds(wait));
  return cat("it sent ", got.size(),
             closed ? " byte(s) and closed the connection: " : " byte(s) and then nothing: ",
             shown(got.data(), got.size()), ", not a job-token handshake");
}

bool check_answer(std::string_view reply, const Nonce& sent, const std::string& token, Digest* ours,
                  std::string* why) {
  if (reply.size() != answer_size() || std::memcmp(reply.data(), kMagic, sizeof kMagic) != 0) {
    *why = cat("it sent ", reply.size(), " bytes: ", shown(reply.data(), reply.size()),
               ", not a job-token handshake");
    return false;
  }
  Nonce theirs;
  Digest proof;
  std::memcpy(theirs.data(), reply.data() + sizeof kMagic, 32);
  std::memcpy(proof.data(), reply.data() + sizeof kMagic + 32, 32);
  if (!same_digest(proof, mac(token, "bt-peer", sent, theirs))) {
    *why = "its proof of the job token is wrong (another token, or a replayed handshake)";
    return false;
  }
  *ours = mac(token, "bt-rank0", theirs, sent);
  return true;
}

bool answer(int fd, const Nonce& sent, const std::string& token, std::chrono::milliseconds wait,
            std::string* why) {
  char reply[sizeof kMagic + 64];
  bool closed = false;
  const size_t got = receive_within(fd, reply, sizeof reply, wait, &closed);
  if (got < sizeof reply) {
    *why = incomplete_answer(std::string_view(reply, got), closed, wait);
    return false;
  }
  Digest mine;
  if (!check_answer(std::string_view(reply, got), sent, token, &mine, why)) return false;
  if (!net::send_all(fd, mine.data(), mine.size())) {
    *why = "it closed the connection after its proof";
    return false;
  }
  return true;
}

bool accept_peer(int fd, const std::string& token, std::chrono::milliseconds wait, std::string* why) {
  Nonce sent;
  if (!greet(fd, !token.empty(), &sent)) {
    *why = "it closed the connection at once";
    return false;
  }
  return token.empty() || answer(fd, sent, token, wait, why);
}

bool join(int fd, const std::string& token, std::chrono::milliseconds wait, std::string* why) {
  char hi[sizeof kMagic + 1 + 32];
  size_t got = receive_within(fd, hi, sizeof hi, wait);
  if (got < sizeof hi || std::memcmp(hi, kMagic, sizeof kMagic) != 0 || (hi[8] != 0 && hi[8] != 1)) {
    *why = got == 0 ? cat("it sent no greeting within ", net::seconds(wait), " (is it a BluTrain rank 0?)")
                    : cat("it sent ", shown(hi, got), " instead of a BluTrain greeting");
    return false;
  }
  const bool asks = hi[8] == 1;
  if (!asks || token.empty()) {
    if (asks == token.empty())
      *why = asks ? "it asks for the job token, and this process has none: set BT_JOB_TOKEN (or "
                    "BT_JOB_TOKEN_FILE) to rank 0's"
                  : "it runs without a job token (dist.insecure), and this process has one: give every rank "
                    "the same setting";
    return asks != token.empty();
  }
  Nonce server, mine;
  std::memcpy(server.data(), hi + sizeof kMagic + 1, 32);
  const std::string r = random_bytes(mine.size());
  std::memcpy(mine.data(), r.data(), mine.size());
  std::string msg(kMagic, sizeof kMagic);
  msg.append(view(mine));
  const Digest proof = mac(token, "bt-peer", server, mine);
  msg.append(view(proof));
  if (!net::send_all(fd, msg.data(), msg.size())) {
    *why = "it closed the connection during the handshake";
    return false;
  }
  Digest theirs;
  got = receive_within(fd, reinterpret_cast<char*>(theirs.data()), theirs.size(), wait);
  if (got < theirs.size()) {
    *why = "it refused this process's job token: BT_JOB_TOKEN differs from rank 0's";
    return false;
  }
  if (!same_digest(theirs, mac(token, "bt-rank0", mine, server))) {
    *why = "its proof of the job token is wrong: it is not this job's rank 0, or has another BT_JOB_TOKEN";
    return false;
  }
  return true;
}

}  // namespace bt::dist::auth
