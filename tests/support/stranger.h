// A stranger at a job's rendezvous ports, for tests of the job token (Note
// [Authenticated rendezvous] in runtime/dist/auth.cpp): a proof recorded from
// one handshake, as a listener on the wire would have it, and a connection
// that does something and waits to be dropped.
#pragma once

#include <functional>
#include <string>

namespace bt::test {

/// The 72 bytes a peer holding `token` sends in answer to a greeting with a
/// fresh nonce (made here, over a socket pair): valid for that handshake only.
std::string recorded_proof(const std::string& token);

/// Connects to 127.0.0.1:port (retrying for up to 10 s), runs `act` on the
/// socket, then reads until the other side closes it (rank 0 dropping the
/// stranger) and closes it. Throws bt::Error when it cannot connect.
void as_stranger(int port, const std::function<void(int fd)>& act);

}  // namespace bt::test
