// A TCP port on localhost that nobody listens on (bound once, then released;
// another process could take it in between, which tests accept).
#pragma once

namespace bt::test {

int free_port();

}  // namespace bt::test
