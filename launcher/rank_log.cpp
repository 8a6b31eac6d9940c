#include "launcher/rank_log.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <fcntl.h>
#include <unistd.h>

#include "kernels/common/error.h"

namespace bt::launcher {
namespace {

struct Tee {
  int terminal_fd, log_fd;
};

bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

ssize_t tee_write(void* cookie, const char* buf, size_t n) {
  const Tee* t = static_cast<const Tee*>(cookie);
  const bool a = write_all(t->terminal_fd, buf, n), b = write_all(t->log_fd, buf, n);
  return (a || b) ? static_cast<ssize_t>(n) : -1;
}

/// A stream writing to both `terminal` (duplicated) and `log_fd`, unbuffered.
FILE* tee_stream(FILE* terminal, int log_fd) {
  // The streams live as long as the process, and so do their cookies: static
  // storage (stdout and stderr), not a heap object LeakSanitizer would report.
  static Tee tees[8];  // two per open_rank_log(); a process calls it once
  static int used = 0;
  Tee* t = &tees[used++ % 8];
  *t = Tee{::dup(fileno(terminal)), log_fd};
  cookie_io_functions_t io{};
  io.write = tee_write;
  FILE* f = fopencookie(t, "w", io);
  BT_CHECK(f != nullptr, "cannot set up the rank-0 log stream: ", std::strerror(errno));
  std::setvbuf(f, nullptr, _IONBF, 0);
  return f;
}

}  // namespace

bool open_rank_log(const dist::World& w) {
  const char* dir = std::getenv("BT_RANK_LOG_DIR");
  if (!dir || !*dir) return false;
  const std::string path = std::string(dir) + "/rank-" + std::to_string(w.rank) + ".log";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  BT_CHECK(fd >= 0, "rank ", w.rank, ": cannot write its log file '", path, "' (", std::strerror(errno),
           "); check BT_RANK_LOG_DIR / blutrain launch --log-dir");
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  const std::string head = "rank " + std::to_string(w.rank) + " of " + std::to_string(w.size) + ", pid " +
                           std::to_string(::getpid()) + ", host " + host + "\n";
  write_all(fd, head.data(), head.size());
  std::fflush(stdout);
  std::fflush(stderr);
  if (w.rank == 0) {
    stdout = tee_stream(stdout, fd);
    stderr = tee_stream(stderr, fd);
  } else {
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
  }
  return true;
}

}  // namespace bt::launcher
