// `blutrain launch --nproc N [--hostfile F] [--mpirun-arg A ...] [--log-dir D]
//                  [--max-restarts K] [--hang-timeout S] -- COMMAND ...`:
// starts N ranks of `blutrain COMMAND ...` through mpirun. Rank 0's output is
// shown; every rank also writes D/rank-<R>.log (launcher/rank_log.h). When a
// rank dies, mpirun stops the others; this command names the rank and how it
// ended, and never waits more than --grace seconds for mpirun to finish.
//
// Supervision: with --max-restarts K, a failed job (a rank that died, or a hang)
// is started again, up to K times, with train.resume=auto so that it goes on
// from its latest checkpoint; each restart is announced with its cause, and
// the earlier attempt's logs are kept as rank-<R>.log.<attempt>. The hang
// watchdog reads the ranks' heartbeats (launcher/heartbeat.h): when none has
// changed for --hang-timeout seconds it prints what each rank was doing and
// stops the job, which then counts as a failure.
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

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/common/error.h"
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "launcher/heartbeat.h"
#include "launcher/stop_request.h"

namespace bt::launcher {
namespace {

namespace fs = std::filesystem;

std::atomic<pid_t> g_child{0};
std::atomic<int> g_interrupted{0};  // the signal the launcher itself got (no restart after it)

void forward_signal(int sig) {
  g_interrupted = sig;
  const pid_t c = g_child.load();
  if (c > 0) ::kill(-c, sig);
}

/// What mpirun said about the first rank that failed.
struct Failure {
  int rank = -1;
  std::string how;       // "was killed by signal 9 (Killed)", "exited with status 1", ...
  int exit_status = -1;  // when it exited
};

class FailureScanner {
 public:
  void line(const std::string& l) {
    std::smatch m;
    static const std::regex sig(
        R"(process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)(?: \(([^)]*)\))?)");
    // Open MPI 4.1 puts "with errorcode N." on the line after this one.
    static const std::regex abort_re(R"(MPI_ABORT was invoked on rank (\d+)(?: .* errorcode (-?\d+))?)");
    static const std::regex name(R"(Process name: \[\[\d+,\d+\],(\d+)\])");
    static const std::regex code(R"(Exit code:\s+(-?\d+))");
    if (std::regex_search(l, m, sig))
      set(std::stoi(m[1]),
          "was killed by signal " + m[2].str() + (m[3].matched ? " (" + m[3].str() + ")" : ""));
    else if (std::regex_search(l, m, abort_re))
      set(std::stoi(m[1]), "stopped the job after an error (MPI_Abort" +
                               (m[2].matched ? ", code " + m[2].str() : std::string()) + ")");
    else if (std::regex_search(l, m, name))
      pending_rank_ = std::stoi(m[1]);
    else if (pending_rank_ >= 0 && std::regex_search(l, m, code))
      set(pending_rank_, "exited with status " + m[1].str(), std::stoi(m[1]));
  }
  const std::optional<Failure>& failure() const { return failure_; }

 private:
  void set(int rank, std::string how, int exit_status = -1) {
    if (!failure_) failure_ = Failure{rank, std::move(how), exit_status};
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

struct Options {
  int nproc = 1, grace = 30, max_restarts = 0;
  double hang_timeout = 0;
  fs::path log_dir;
  std::vector<std::string> command;
};

/// How one run of mpirun ended.
struct Outcome {
  int code = 0;
  std::optional<Failure> failure;
  std::string hang;  // the watchdog's report, when it stopped the job
};

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string first_line(const std::string& path) {
  std::ifstream f(path);
  std::string l;
  std::getline(f, l);
  return l;
}

std::string rank_base(const Options& o, int r) {
  return (o.log_dir / ("rank-" + std::to_string(r))).string();
}

/// The newest heartbeat of any rank (0: none yet).
double newest_heartbeat(const Options& o) {
  double newest = 0;
  for (int r = 0; r < o.nproc; ++r) {
    RankStatus st;
    if (parse_rank_status(first_line(rank_base(o, r) + ".status"), st)) newest = std::max(newest, st.since);
  }
  return newest;
}

/// What each rank was doing: its heartbeat and, for a rank on this host, its
/// process state and kernel wait channel; then its last log line.
std::string hang_report(const Options& o, double quiet_s) {
  char me[256] = "?";
  ::gethostname(me, sizeof me - 1);
  std::string out = fmt::format(
      "blutrain launch: no rank made progress for {:.0f} s (--hang-timeout {:g}); what each rank was "
      "doing:\n",
      quiet_s, o.hang_timeout);
  const double now = unix_now();
  for (int r = 0; r < o.nproc; ++r) {
    RankStatus st;
    if (!parse_rank_status(first_line(rank_base(o, r) + ".status"), st)) {
      out += fmt::format("  rank {}: no heartbeat (it had not started training)\n", r);
      continue;
    }
    out += fmt::format("  rank {} (pid {} on {}): {}, for {:.0f} s", r, st.pid, st.host, st.what,
                       now - st.since);
    if (st.host == me) {
      const std::string proc = "/proc/" + std::to_string(st.pid);
      const std::string stat = first_line(proc + "/stat"), wchan = first_line(proc + "/wchan");
      const size_t paren = stat.rfind(") ");
      if (paren == std::string::npos)
        out += "; the process is gone";
      else
        out += "; process state " + stat.substr(paren + 2, 1) +
               (wchan.empty() || wchan == "0" ? "" : ", waiting in " + wchan);
    }
    out += "\n" + tail_of(rank_base(o, r) + ".log", 1);
  }
  return out;
}

/// The first rank whose log has the line `blutrain CMD: error on rank R of N:`
/// (launcher/main.cpp), for a failed job whose failed rank mpirun did not
/// name: Open MPI 4.1 sometimes loses its MPI_ABORT report while it tears the
/// job down ("ORTE_ERROR_LOG: Data unpack would read past end of buffer in
/// file orte/util/show_help.c"; measured: 2 jobs in 5).
std::optional<Failure> failure_from_logs(const Options& o) {
  static const std::regex error_re(R"(: error on rank (\d+) of \d+: )");
  for (int r = 0; r < o.nproc; ++r) {
    std::ifstream f(rank_base(o, r) + ".log");
    std::smatch m;
    for (std::string l; std::getline(f, l);)
      if (std::regex_search(l, m, error_re) && std::stoi(m[1]) == r)
        return Failure{r, "stopped the job after an error"};
  }
  return std::nullopt;
}

/// Runs mpirun with `args` until it ends, forwarding its stderr, naming the
/// first failed rank, and watching the heartbeats.
Outcome run_once(const std::vector<std::string>& args, const Options& o) {
  int err_pipe[2];
  BT_CHECK(::pipe2(err_pipe, O_CLOEXEC) == 0, "cannot create a pipe: ", std::strerror(errno));
  const pid_t child = ::fork();
  BT_CHECK(child >= 0, "cannot start mpirun: fork failed: ", std::strerror(errno));
  if (child == 0) {
    ::setpgid(0, 0);  // mpirun and its ranks: one group the launcher can stop
    ::dup2(err_pipe[1], STDERR_FILENO);
    std::vector<char*> cargs;
    for (const std::string& a : args) cargs.push_back(const_cast<char*>(a.c_str()));
    cargs.push_back(nullptr);
    ::execvp(cargs[0], cargs.data());
    std::fprintf(stderr, "blutrain launch: cannot run '%s': %s; install Open MPI or pass --mpirun PATH\n",
                 cargs[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(child, child);
  ::close(err_pipe[1]);
  g_child = child;

  // Forward mpirun's stderr line by line, watching for a failed rank.
  FailureScanner scan;
  Outcome out;
  std::string partial;
  std::optional<std::chrono::steady_clock::time_point> failed_at;
  bool killed = false, eof = false;
  int status = 0;
  double next_watch = unix_now() + 1;
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
    if (failed_at && !killed &&
        std::chrono::steady_clock::now() - *failed_at > std::chrono::seconds(o.grace)) {
      std::fprintf(stderr, "blutrain launch: mpirun did not stop the job within %d s; killing every rank\n",
                   o.grace);
      ::kill(-child, SIGKILL);
      killed = true;
    }
    const double now = unix_now();
    if (o.hang_timeout > 0 && !killed && now >= next_watch) {
      next_watch = now + 1;
      // Armed by the first heartbeat: a command that sends none is never stopped.
      const double newest = newest_heartbeat(o), quiet = now - newest;
      if (newest > 0 && quiet > o.hang_timeout) {
        out.hang = hang_report(o, quiet);
        std::fprintf(stderr, "%sblutrain launch: stopping every rank (SIGKILL)\n", out.hang.c_str());
        ::kill(-child, SIGKILL);
        killed = true;
      }
    }
  }
  if (!partial.empty()) std::fprintf(stderr, "%s\n", partial.c_str());
  ::close(err_pipe[0]);
  g_child = 0;
  out.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  out.failure = scan.failure();
  if (!out.failure && out.hang.empty() && out.code != 0) out.failure = failure_from_logs(o);
  return out;
}

/// An earlier attempt's logs move aside (rank-<R>.log.<attempt>); heartbeats go.
void set_aside_logs(const Options& o, int attempt) {
  for (int r = 0; r < o.nproc; ++r) {
    std::error_code ec;
    if (attempt > 0)
      fs::rename(rank_base(o, r) + ".log", rank_base(o, r) + ".log." + std::to_string(attempt), ec);
    fs::remove(rank_base(o, r) + ".status", ec);
  }
}

/// Why an attempt failed, in words; "" when it did not.
std::string cause_of(const Outcome& out) {
  if (!out.hang.empty()) return "the job hung (no progress for --hang-timeout seconds)";
  if (out.failure) return "rank " + std::to_string(out.failure->rank) + " " + out.failure->how;
  if (out.code != 0) return "mpirun exited with status " + std::to_string(out.code);
  return "";
}

}  // namespace

int run_launch(int argc, char** argv) {
  int split = argc;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--") == 0) {
      split = i;
      break;
    }
  Options o;
  o.command.assign(argv + std::min(split + 1, argc), argv + argc);

  cli::Options opts("blutrain launch",
                    "Start N ranks of a blutrain command through mpirun.\n"
                    "Usage: blutrain launch --nproc N [options] -- train [train options]");
  opts.add_options()("n,nproc", "ranks to start", cli::value<int>())(
      "hostfile", "Open MPI hostfile (default: every rank on this host, oversubscribed if need be)",
      cli::value<std::string>())("mpirun-arg", "an extra mpirun argument (repeatable)",
                                 cli::value<std::vector<std::string>>())(
      "log-dir", "folder for the per-rank logs rank-<R>.log",
      cli::value<std::string>()->default_value("logs"))("mpirun", "the mpirun to use",
                                                        cli::value<std::string>()->default_value("mpirun"))(
      "grace", "seconds to wait for mpirun to stop the other ranks after one failed",
      cli::value<int>()->default_value("30"))(
      "max-restarts",
      "after a failed rank or a hang, start the job again from its latest checkpoint "
      "(train.resume=auto), at most this many times",
      cli::value<int>()->default_value("0"))(
      "hang-timeout",
      "seconds in which no rank begins anything new (a step, an evaluation, a checkpoint) before the "
      "job is reported and stopped as hung (0: no watchdog)",
      cli::value<double>()->default_value("900"))("h,help", "show this help");
  int pargc = split;
  cli::ParseResult r;
  try {
    r = opts.parse(pargc, argv);
  } catch (const std::exception& e) {
    BT_FAIL(e.what(), " (see blutrain launch --help)");
  }
  if (r.count("help")) {
    std::printf("%s\n", opts.help().c_str());
    return 0;
  }
  BT_CHECK(r.count("nproc"), "give the number of ranks with --nproc N");
  o.nproc = r["nproc"].as<int>();
  BT_CHECK(o.nproc >= 1, "--nproc must be >= 1, got ", o.nproc);
  BT_CHECK(!o.command.empty(),
           "give the command to run after --, e.g. blutrain launch --nproc 2 -- train --config c.yaml");
  BT_CHECK(o.command[0] != "launch", "blutrain launch cannot launch itself");
  o.grace = r["grace"].as<int>();
  BT_CHECK(o.grace >= 1, "--grace must be >= 1 second, got ", o.grace);
  o.max_restarts = r["max-restarts"].as<int>();
  BT_CHECK(o.max_restarts >= 0, "--max-restarts must be >= 0, got ", o.max_restarts);
  o.hang_timeout = r["hang-timeout"].as<double>();
  BT_CHECK(o.hang_timeout >= 0, "--hang-timeout must be >= 0 seconds (0: off), got ", o.hang_timeout);

  std::vector<std::string> args = {r["mpirun"].as<std::string>(), "-np", std::to_string(o.nproc)};
  if (r.count("hostfile")) {
    const std::string hf = r["hostfile"].as<std::string>();
    BT_CHECK(fs::is_regular_file(hf), "--hostfile '", hf, "' does not exist or is not a file");
    args.insert(args.end(), {"--hostfile", hf});
  } else {
    args.push_back("--oversubscribe");  // one host: allow more ranks than cores
  }
  if (::geteuid() == 0) args.push_back("--allow-run-as-root");  // containers and CI
  o.log_dir = fs::absolute(r["log-dir"].as<std::string>());
  std::error_code ec;
  fs::create_directories(o.log_dir, ec);
  BT_CHECK(!ec && fs::is_directory(o.log_dir), "cannot create the log folder '", o.log_dir.string(),
           "': ", ec.message());
  ::setenv("BT_RANK_LOG_DIR", o.log_dir.c_str(), 1);
  args.insert(args.end(), {"-x", "BT_RANK_LOG_DIR"});
  if (r.count("mpirun-arg"))
    for (const std::string& a : r["mpirun-arg"].as<std::vector<std::string>>()) args.push_back(a);
  args.push_back(self_exe());
  args.insert(args.end(), o.command.begin(), o.command.end());

  struct sigaction sa {};
  sa.sa_handler = forward_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  set_aside_logs(o, 0);  // a heartbeat left by an earlier job must not count
  for (int attempt = 0;; ++attempt) {
    std::string shown;
    for (const std::string& a : args) shown += (shown.empty() ? "" : " ") + a;
    std::fprintf(stderr, "blutrain launch: %d rank%s, logs in %s/rank-*.log%s\n  %s\n", o.nproc,
                 o.nproc == 1 ? "" : "s", o.log_dir.c_str(),
                 r.count("log-dir") ? "" : " (the default, ./logs: --log-dir puts them elsewhere)",
                 shown.c_str());
    std::fflush(stderr);
    const Outcome out = run_once(args, o);
    const std::string cause = cause_of(out);
    if (cause.empty()) return 0;
    // Every rank saved a checkpoint and stopped on request (Note [Stop requests]).
    const bool stopped = out.hang.empty() && out.code == kExitStopped &&
                         (!out.failure || out.failure->exit_status == kExitStopped);
    const int code = out.code ? out.code : 1;
    if (out.failure && !stopped) {
      const std::string log = rank_base(o, out.failure->rank) + ".log";
      std::fprintf(stderr, "blutrain launch: %s; every rank was stopped (exit status %d). Its log: %s\n%s",
                   cause.c_str(), code, log.c_str(), tail_of(log, 5).c_str());
    } else if (!stopped) {
      std::fprintf(stderr, "blutrain launch: %s; see %s/rank-*.log\n", cause.c_str(), o.log_dir.c_str());
    }
    if (stopped) {
      std::fprintf(stderr,
                   "blutrain launch: the ranks saved a checkpoint and stopped on request (exit status %d); "
                   "not restarting: start the job again with train.resume=auto to go on\n",
                   kExitStopped);
      return kExitStopped;
    }
    if (g_interrupted) return code;  // the user or the scheduler stopped the launcher itself
    if (attempt >= o.max_restarts) {
      if (o.max_restarts > 0)
        std::fprintf(
            stderr,
            "blutrain launch: giving up: the restart budget is spent (--max-restarts %d, %d restart%s "
            "made); the last failure: %s. Fix the cause, then start the job again with "
            "train.resume=auto to go on from its latest checkpoint\n",
            o.max_restarts, attempt, attempt == 1 ? "" : "s", cause.c_str());
      return code;
    }
    set_aside_logs(o, attempt + 1);
    std::fprintf(stderr,
                 "blutrain launch: restart %d of %d after: %s. Starting every rank again from the latest "
                 "checkpoint (train.resume=auto); the failed attempt's logs are rank-*.log.%d\n",
                 attempt + 1, o.max_restarts, cause.c_str(), attempt + 1);
    if (attempt == 0 && o.command[0] == "train") args.insert(args.end(), {"--set", "train.resume=auto"});
  }
}

}  // namespace bt::launcher
