#include "launcher/stop_request.h"

#include <atomic>
#include <csignal>

#include "runtime/bt.h"
#include "runtime/dist/process_group.h"

namespace bt::launcher {
namespace {

std::atomic<int> g_signal{0};

extern "C" void on_stop_signal(int sig) {
  int none = 0;
  if (!g_signal.compare_exchange_strong(none, sig) && sig == SIGTERM) {
    // Asked twice: stop now, as SIGTERM does by default.
    std::signal(SIGTERM, SIG_DFL);
    std::raise(SIGTERM);
  }
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGUSR1, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

std::string stop_signal_name() {
  switch (g_signal.load()) {
    case SIGUSR1:
      return "SIGUSR1";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "another rank's signal";
  }
}

bool stop_agreed(const dist::World& w) {
  const bool mine = g_signal.load() != 0;
  if (!w.distributed()) return mine;
  Tensor t = full({1}, mine ? 1.0 : 0.0, TensorOptions{}.with_dtype(DType::F64));
  dist::cpu_group()->all_reduce(t, dist::ReduceOp::Sum);
  return t.item<double>() > 0;
}

}  // namespace bt::launcher
