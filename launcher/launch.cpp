// `blutrain launch --nproc N [--hostfile F] [--mpirun-arg A ...] [--log-dir D] -- COMMAND ...`:
// starts N ranks of `blutrain COMMAND ...` through mpirun. Rank 0's output is
// shown; every rank also writes D/rank-<R>.log (launcher/rank_log.h). When a
// rank dies, mpirun stops the others; this command names the rank and how it
// ended, and never waits more than --grace seconds for mpirun to finish.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <cxxopts.hpp>
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/common/error.h"
#include "launcher/commands.h"

namespace bt::launcher {
namespace {

namespace fs = std::filesystem;

std::atomic<pid_t> g_child{0};

void forward_signal(int sig) {
  const pid_t c = g_child.load();
  if (c > 0) ::kill(-c, sig);
}

/// What mpirun said about the first rank that failed.
struct Failure {
  int rank = -1;
  std::string how;  // "was killed by signal 9 (Killed)", "exited with status 1", ...
};

class FailureScanner {
 public:
  void line(const std::string& l) {
    std::smatch m;
    static const std::regex sig(
        R"(process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)(?: \(([^)]*)\))?)");
    static const std::regex abort_re(R"(MPI_ABORT was invoked on rank (\d+) .* errorcode (-?\d+))");
    static const std::regex name(R"(Process name: \[\[\d+,\d+\],(\d+)\])");
    static const std::regex code(R"(Exit code:\s+(-?\d+))");
    if (std::regex_search(l, m, sig))
      set(std::stoi(m[1]),
          "was killed by signal " + m[2].str() + (m[3].matched ? " (" + m[3].str() + ")" : ""));
    else if (std::regex_search(l, m, abort_re))
      set(std::stoi(m[1]), "stopped the job after an error (MPI_Abort, code " + m[2].str() + ")");
    else if (std::regex_search(l, m, name))
      pending_rank_ = std::stoi(m[1]);
    else if (pending_rank_ >= 0 && std::regex_search(l, m, code))
      set(pending_rank_, "exited with status " + m[1].str());
  }
  const std::optional<Failure>& failure() const { return failure_; }

 private:
  void set(int rank, std::string how) {
    if (!failure_) failure_ = Failure{rank, std::move(how)};
  }
  std::optional<Failure> failure_;
  int pending_rank_ = -1;
};

std::string self_exe() {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  BT_CHECK(!ec, "cannot find the blutrain executable (/proc/self/exe): ", ec.message());
  return p.string();
}

std::string tail_of(const std::string& path, int lines) {
  std::ifstream f(path);
  std::vector<std::string> all;
  for (std::string l; std::getline(f, l);) all.push_back(l);
  std::string out;
  for (size_t i = all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0; i < all.size(); ++i)
    out += "    " + all[i] + "\n";
  return out;
}

}  // namespace

int run_launch(int argc, char** argv) {
  int split = argc;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--") == 0) {
      split = i;
      break;
    }
  std::vector<std::string> command(argv + std::min(split + 1, argc), argv + argc);

  cxxopts::Options opts("blutrain launch",
                        "Start N ranks of a blutrain command through mpirun.\n"
                        "Usage: blutrain launch --nproc N [options] -- train [train options]");
  opts.add_options()("n,nproc", "ranks to start", cxxopts::value<int>())(
      "hostfile", "Open MPI hostfile (default: every rank on this host, oversubscribed if need be)",
      cxxopts::value<std::string>())("mpirun-arg", "an extra mpirun argument (repeatable)",
                                     cxxopts::value<std::vector<std::string>>())(
      "log-dir", "folder for the per-rank logs rank-<R>.log",
      cxxopts::value<std::string>()->default_value("logs"))(
      "mpirun", "the mpirun to use", cxxopts::value<std::string>()->default_value("mpirun"))(
      "grace", "seconds to wait for mpirun to stop the other ranks after one failed",
      cxxopts::value<int>()->default_value("30"))("h,help", "show this help");
  int pargc = split;
  const auto r = opts.parse(pargc, argv);
  if (r.count("help")) {
    std::printf("%s\n", opts.help().c_str());
    return 0;
  }
  BT_CHECK(r.count("nproc"), "give the number of ranks with --nproc N");
  const int nproc = r["nproc"].as<int>();
  BT_CHECK(nproc >= 1, "--nproc must be >= 1, got ", nproc);
  BT_CHECK(!command.empty(),
           "give the command to run after --, e.g. blutrain launch --nproc 2 -- train --config c.yaml");
  BT_CHECK(command[0] != "launch", "blutrain launch cannot launch itself");
  const int grace = r["grace"].as<int>();
  BT_CHECK(grace >= 1, "--grace must be >= 1 second, got ", grace);

  std::vector<std::string> args = {r["mpirun"].as<std::string>(), "-np", std::to_string(nproc)};
  if (r.count("hostfile")) {
    const std::string hf = r["hostfile"].as<std::string>();
    BT_CHECK(fs::is_regular_file(hf), "--hostfile '", hf, "' does not exist or is not a file");
    args.insert(args.end(), {"--hostfile", hf});
  } else {
    args.push_back("--oversubscribe");  // one host: allow more ranks than cores
  }
  if (::geteuid() == 0) args.push_back("--allow-run-as-root");  // containers and CI
  const fs::path log_dir = fs::absolute(r["log-dir"].as<std::string>());
  std::error_code ec;
  fs::create_directories(log_dir, ec);
  BT_CHECK(!ec && fs::is_directory(log_dir), "cannot create the log folder '", log_dir.string(),
           "': ", ec.message());
  ::setenv("BT_RANK_LOG_DIR", log_dir.c_str(), 1);
  args.insert(args.end(), {"-x", "BT_RANK_LOG_DIR"});
  if (r.count("mpirun-arg"))
    for (const std::string& a : r["mpirun-arg"].as<std::vector<std::string>>()) args.push_back(a);
  args.push_back(self_exe());
  args.insert(args.end(), command.begin(), command.end());

  std::string shown;
  for (const std::string& a : args) shown += (shown.empty() ? "" : " ") + a;
  std::fprintf(stderr, "blutrain launch: %d rank%s, logs in %s/rank-*.log\n  %s\n", nproc,
               nproc == 1 ? "" : "s", log_dir.c_str(), shown.c_str());
  std::fflush(stderr);

  int err_pipe[2];
  BT_CHECK(::pipe2(err_pipe, O_CLOEXEC) == 0, "cannot create a pipe: ", std::strerror(errno));
  const pid_t child = ::fork();
  BT_CHECK(child >= 0, "cannot start mpirun: fork failed: ", std::strerror(errno));
  if (child == 0) {
    ::setpgid(0, 0);  // mpirun and its ranks: one group the launcher can stop
    ::dup2(err_pipe[1], STDERR_FILENO);
    std::vector<char*> cargs;
    for (std::string& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    ::execvp(cargs[0], cargs.data());
    std::fprintf(stderr, "blutrain launch: cannot run '%s': %s; install Open MPI or pass --mpirun PATH\n",
                 cargs[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(child, child);
  ::close(err_pipe[1]);
  g_child = child;
  struct sigaction sa {};
  sa.sa_handler = forward_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);

  // Forward mpirun's stderr line by line, watching for a failed rank.
  FailureScanner scan;
  std::string partial;
  std::optional<std::chrono::steady_clock::time_point> failed_at;
  bool killed = false, eof = false;
  int status = 0;
  for (;;) {
    if (!eof) {
      pollfd p{err_pipe[0], POLLIN, 0};
      if (::poll(&p, 1, 200) > 0) {
        char buf[4096];
        const ssize_t n = ::read(err_pipe[0], buf, sizeof buf);
        if (n <= 0) {
          eof = n == 0 || errno != EINTR;
        } else {
          partial.append(buf, static_cast<size_t>(n));
          for (size_t nl; (nl = partial.find('\n')) != std::string::npos;) {
            const std::string l = partial.substr(0, nl);
            partial.erase(0, nl + 1);
            std::fprintf(stderr, "%s\n", l.c_str());
            scan.line(l);
          }
        }
      }
    } else {
      ::usleep(100'000);
    }
    if (scan.failure() && !failed_at) failed_at = std::chrono::steady_clock::now();
    const pid_t w = ::waitpid(child, &status, WNOHANG);
    if (w == child) break;
    if (failed_at && !killed && std::chrono::steady_clock::now() - *failed_at > std::chrono::seconds(grace)) {
      std::fprintf(stderr, "blutrain launch: mpirun did not stop the job within %d s; killing every rank\n",
                   grace);
      ::kill(-child, SIGKILL);
      killed = true;
    }
  }
  if (!partial.empty()) std::fprintf(stderr, "%s\n", partial.c_str());
  ::close(err_pipe[0]);
  g_child = 0;

  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (code == 0 && !scan.failure()) return 0;
  if (const auto& f = scan.failure()) {
    const std::string log = (log_dir / ("rank-" + std::to_string(f->rank) + ".log")).string();
    std::fprintf(stderr,
                 "blutrain launch: rank %d %s; every rank was stopped (exit status %d). Its log: %s\n%s",
                 f->rank, f->how.c_str(), code ? code : 1, log.c_str(), tail_of(log, 5).c_str());
  } else {
    std::fprintf(stderr, "blutrain launch: mpirun exited with status %d; see %s/rank-*.log\n", code,
                 log_dir.c_str());
  }
  return code ? code : 1;
}

}  // namespace bt::launcher
