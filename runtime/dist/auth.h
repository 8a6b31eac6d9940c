// Job tokens and the handshake that proves one over a TCP connection: what
// the rendezvous store (tcp_store.h) and the TCP process group (tcp_star.h)
// run on every connection before anything else (Note [Authenticated
// rendezvous] in auth.cpp; docs/distributed.md has the threat model).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace bt::dist::auth {

using Digest = std::array<uint8_t, 32>;
using Nonce = std::array<uint8_t, 32>;

/// SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104) of bytes.
Digest sha256(std::string_view data);
Digest hmac_sha256(std::string_view key, std::string_view message);
/// Equal, in a time that does not depend on where they differ.
bool same_digest(const Digest& a, const Digest& b);
/// `n` bytes from the kernel's random source (getrandom), or a bt::Error.
std::string random_bytes(size_t n);
/// A new job token: 32 random bytes as 64 hexadecimal characters.
std::string new_token();
/// Lowercase hexadecimal of bytes.
std::string hex(std::string_view bytes);

/// The job's token: BT_JOB_TOKEN, else the contents of the file
/// BT_JOB_TOKEN_FILE names (surrounding whitespace dropped), else none.
/// Throws bt::Error naming the variable for an unreadable file or a token
/// shorter than 16 characters.
std::optional<std::string> job_token();

/// Rank 0's half of the handshake (Note [Authenticated rendezvous]), in two
/// calls so a server that polls many sockets never waits on one: greet()
/// sends the greeting on a socket it just accepted -- asking for the token,
/// with a fresh nonce, when `token` -- and answer() (once the socket is
/// readable) reads the peer's proof within `wait`, checks it and sends rank
/// 0's own. False, with what the peer sent in `why`, when the peer did not
/// prove the token: the caller closes it.
bool greet(int fd, bool token, Nonce* sent);
bool answer(int fd, const Nonce& sent, const std::string& token, std::chrono::milliseconds wait,
            std::string* why);
/// answer() in parts, for a server that reads its sockets without waiting
/// (tcp_store.cpp): a peer's answer to the greeting is answer_size() bytes;
/// check_answer() checks one against the nonce `sent` and gives rank 0's
/// proof to send back in `ours`, or false with the reason in `why`;
/// incomplete_answer() is the reason for one that stopped short after `got`
/// (`closed`: the peer closed the connection; else `wait` ran out).
size_t answer_size();
bool check_answer(std::string_view reply, const Nonce& sent, const std::string& token, Digest* ours,
                  std::string* why);
std::string incomplete_answer(std::string_view got, bool closed, std::chrono::milliseconds wait);
/// Both server calls in a row, for a server that handles one peer at a time
/// (an empty `token`: the greeting only).
bool accept_peer(int fd, const std::string& token, std::chrono::milliseconds wait, std::string* why);
/// The connecting side (an empty `token`: none): reads the greeting, proves
/// the token and checks that the server knows it too. False, with the reason
/// in `why` -- a wrong token, or a setting that differs from rank 0's.
bool join(int fd, const std::string& token, std::chrono::milliseconds wait, std::string* why);

/// "10.0.0.5:51234": the address of a connected socket's peer.
std::string peer_of(int fd);

}  // namespace bt::dist::auth
