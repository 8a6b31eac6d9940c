// Job tokens (Note [Authenticated rendezvous] in runtime/dist/auth.cpp):
// SHA-256 and HMAC-SHA-256 against the published test vectors (FIPS 180-4's
// examples, RFC 4231), and the handshake over a real socket pair: the right
// token lets a peer in both ways; a wrong token, a replayed proof, garbage,
// silence and a setting that differs from rank 0's are each refused, saying
// which.
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/dist/auth.h"
#include "runtime/dist/tcp_socket.h"
#include "tests/support/error_message.h"
#include "tests/support/scoped_env.h"
#include "tests/support/stranger.h"
#include "tests/support/temp_dir.h"

namespace bt::dist::auth {
namespace {

using std::chrono::milliseconds;

std::string hex_of(const Digest& d) {
  return hex(std::string_view(reinterpret_cast<const char*>(d.data()), d.size()));
}

TEST(Auth, Sha256MatchesTheFipsExamples) {
  EXPECT_EQ(hex_of(sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex_of(sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex_of(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(hex_of(sha256(std::string(1'000'000, 'a'))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Auth, HmacSha256MatchesRfc4231) {
  EXPECT_EQ(hex_of(hmac_sha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hex_of(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hex_of(hmac_sha256(std::string(20, '\xaa'), std::string(50, '\xdd'))),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  const std::string long_key(131, '\xaa');  // longer than a block: hashed first
  EXPECT_EQ(hex_of(hmac_sha256(long_key, "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_EQ(
      hex_of(hmac_sha256(long_key,
                         "This is a test using a larger than block-size key and a larger than block-size "
                         "data. The key needs to be hashed before being used by the HMAC algorithm.")),
      "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
  Digest a = sha256("x"), b = a;
  EXPECT_TRUE(same_digest(a, b));
  b[31] ^= 1;
  EXPECT_FALSE(same_digest(a, b));
}

TEST(Auth, NewTokensAreRandomHex) {
  const std::string a = new_token(), b = new_token();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_NE(a, b);
}

TEST(Auth, TheJobTokenComesFromTheEnvironmentOrAFile) {
  test::TempDir dir("bt_auth");
  {
    const test::ScopedEnv none("BT_JOB_TOKEN", "");
    const test::ScopedEnv no_file("BT_JOB_TOKEN_FILE", "");
    EXPECT_FALSE(job_token().has_value());
  }
  {
    const test::ScopedEnv t("BT_JOB_TOKEN", "0123456789abcdef0123");
    EXPECT_EQ(job_token().value_or(""), "0123456789abcdef0123");
  }
  const std::string file = dir.file("token");
  std::ofstream(file) << "  sixteen-chars-or-more\n";
  {
    const test::ScopedEnv none("BT_JOB_TOKEN", "");
    const test::ScopedEnv f("BT_JOB_TOKEN_FILE", file);
    EXPECT_EQ(job_token().value_or(""), "sixteen-chars-or-more");
  }
  {
    const test::ScopedEnv none("BT_JOB_TOKEN", "");
    const test::ScopedEnv f("BT_JOB_TOKEN_FILE", dir.file("missing"));
    const std::string m = test::error_message([] { job_token(); });
    EXPECT_NE(m.find("BT_JOB_TOKEN_FILE=" + dir.file("missing") + ": cannot read the file"),
              std::string::npos)
        << m;
  }
  const test::ScopedEnv shorter("BT_JOB_TOKEN", "short");
  const std::string m = test::error_message([] { job_token(); });
  EXPECT_NE(m.find("BT_JOB_TOKEN holds a token of 5 characters; use at least 16"), std::string::npos) << m;
}

/// A connected pair of stream sockets, closed at the end of the scope.
struct Pair {
  int fd[2] = {-1, -1};
  Pair() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fd), 0); }
  ~Pair() {
    for (int f : fd)
      if (f >= 0) ::close(f);
  }
  Pair(const Pair&) = delete;
  Pair& operator=(const Pair&) = delete;
};

struct Outcome {
  bool server = false, client = false;
  std::string server_why, client_why;
};

/// rank 0's accept_peer on one end, join on the other, at once.
Outcome handshake(const std::string& server_token, const std::string& client_token) {
  Pair p;
  Outcome o;
  std::thread server([&] {
    o.server = accept_peer(p.fd[0], server_token, milliseconds(2000), &o.server_why);
    if (!o.server) ::shutdown(p.fd[0], SHUT_RDWR);  // rank 0 closes a refused peer
  });
  o.client = join(p.fd[1], client_token, milliseconds(2000), &o.client_why);
  if (!o.client) ::shutdown(p.fd[1], SHUT_RDWR);  // a client that gave up leaves, as a process would
  server.join();
  return o;
}

TEST(Auth, TheRightTokenLetsAPeerInAndAWrongOneDoesNot) {
  const std::string token = new_token();
  Outcome ok = handshake(token, token);
  EXPECT_TRUE(ok.server) << ok.server_why;
  EXPECT_TRUE(ok.client) << ok.client_why;
  Outcome open = handshake("", "");  // dist.insecure on both sides: the greeting only
  EXPECT_TRUE(open.server) << open.server_why;
  EXPECT_TRUE(open.client) << open.client_why;

  Outcome wrong = handshake(token, new_token());
  EXPECT_FALSE(wrong.server);
  EXPECT_NE(wrong.server_why.find("its proof of the job token is wrong"), std::string::npos)
      << wrong.server_why;
  EXPECT_FALSE(wrong.client);
  EXPECT_NE(wrong.client_why.find("it refused this process's job token"), std::string::npos)
      << wrong.client_why;

  Outcome none = handshake(token, "");
  EXPECT_FALSE(none.client);
  EXPECT_NE(none.client_why.find("it asks for the job token, and this process has none"), std::string::npos)
      << none.client_why;
  EXPECT_FALSE(none.server);
  EXPECT_NE(none.server_why.find("it closed the connection without a proof of the job token"),
            std::string::npos)
      << none.server_why;
  Outcome extra = handshake("", token);
  EXPECT_FALSE(extra.client);
  EXPECT_NE(extra.client_why.find("it runs without a job token (dist.insecure)"), std::string::npos)
      << extra.client_why;
}

// A proof recorded from one handshake does not fit the next one's nonce.
TEST(Auth, AReplayedProofIsRefused) {
  const std::string token = new_token();
  const std::string recorded = test::recorded_proof(token);  // what a listener on the wire saw
  Pair p;
  Nonce second;
  ASSERT_TRUE(greet(p.fd[0], true, &second));
  char greeting[41];
  ASSERT_TRUE(net::recv_all(p.fd[1], greeting, sizeof greeting));
  ASSERT_TRUE(net::send_all(p.fd[1], recorded.data(), recorded.size()));
  std::string why;
  EXPECT_FALSE(answer(p.fd[0], second, token, milliseconds(2000), &why));
  EXPECT_NE(why.find("another token, or a replayed handshake"), std::string::npos) << why;
}

TEST(Auth, GarbageAndSilenceAreRefusedSayingWhatCame) {
  const std::string token = new_token();
  {
    Pair p;
    const std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_TRUE(net::send_all(p.fd[1], http.data(), http.size()));
    ::shutdown(p.fd[1], SHUT_WR);
    std::string why;
    EXPECT_FALSE(accept_peer(p.fd[0], token, milliseconds(2000), &why));
    EXPECT_NE(why.find("it sent 27 byte(s) and closed the connection: 'GET / HTTP/1.1\\x0d\\x0aHost: x"),
              std::string::npos)
        << why;
  }
  {
    Pair p;
    std::string why;
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_FALSE(accept_peer(p.fd[0], token, milliseconds(200), &why));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(2000));
    EXPECT_NE(why.find("it sent nothing within 0.2 s"), std::string::npos) << why;
  }
  {
    Pair p;  // a stranger that trickles a byte every 50 ms: the wait bounds the whole proof
    std::atomic<bool> stop{false};
    std::thread trickle([&] {
      for (int i = 0; i < 60 && !stop; ++i) {
        if (!net::send_all(p.fd[1], "B", 1)) break;
        std::this_thread::sleep_for(milliseconds(50));
      }
    });
    std::string why;
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_FALSE(accept_peer(p.fd[0], token, milliseconds(300), &why));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(1500));
    stop = true;
    trickle.join();
    EXPECT_NE(why.find("byte(s) and then nothing: 'BBB"), std::string::npos) << why;
  }
  {
    Pair p;  // a server that is not a BluTrain rank 0
    const std::string banner = "SSH-2.0-OpenSSH_9.2\r\n and more bytes to fill the greeting";
    ASSERT_TRUE(net::send_all(p.fd[0], banner.data(), banner.size()));
    std::string why;
    EXPECT_FALSE(join(p.fd[1], token, milliseconds(2000), &why));
    EXPECT_NE(why.find("it sent 'SSH-2.0-OpenSSH_9.2"), std::string::npos) << why;
    EXPECT_NE(why.find("instead of a BluTrain greeting"), std::string::npos) << why;
  }
}

}  // namespace
}  // namespace bt::dist::auth
