#include "runtime/core/profiler.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "runtime/core/stream.h"

#ifdef BT_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace bt {
namespace {

struct Entry {
  double ms = 0;
  int64_t calls = 0;
};

std::mutex g_mu;
std::map<std::string, Entry> g_table;
thread_local std::string t_path;

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

bool profiling_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("BT_PROFILE");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return on;
}

// Note [NVTX ranges]
// In a CUDA build every ProfileScope is also an NVTX range, BT_PROFILE or not,
// so an Nsight Systems trace (nsys profile -t cuda,nvtx) shows steps, blocks
// and backward ops by name over the kernels they launch, without the device
// synchronizations BT_PROFILE adds. With no tool attached, nvtxRangePushA and
// nvtxRangePop return after one check of a function pointer.
namespace {

void range_push(const char* name) {
#ifdef BT_CUDA
  nvtxRangePushA(name);
#else
  (void)name;
#endif
}

void range_pop() {
#ifdef BT_CUDA
  nvtxRangePop();
#endif
}

}  // namespace

ProfileScope::ProfileScope(const char* name) : on_(profiling_enabled()) {
  range_push(name);
  if (!on_) return;
  device_synchronize();
  prefix_len_ = t_path.size();
  if (!t_path.empty()) t_path += '/';
  t_path += name;
  t0_ = now_ms();
}

ProfileScope::~ProfileScope() {
  if (on_) {
    device_synchronize();
    const double ms = now_ms() - t0_;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      Entry& e = g_table[t_path];
      e.ms += ms;
      ++e.calls;
    }
    t_path.resize(prefix_len_);
  }
  range_pop();
}

std::string profile_report() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<std::pair<std::string, Entry>> rows(g_table.begin(), g_table.end());
  double top = 0;
  for (const auto& [name, e] : rows)
    if (name.find('/') == std::string::npos) top += e.ms;
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  std::string out = fmt::format("{:<48} {:>10} {:>8} {:>7}\n", "scope", "total ms", "calls", "share");
  for (const auto& [name, e] : rows)
    out += fmt::format("{:<48} {:>10.2f} {:>8} {:>6.1f}%\n", name, e.ms, e.calls,
                       top > 0 ? 100.0 * e.ms / top : 0.0);
  return out;
}

void profile_reset() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_table.clear();
}

}  // namespace bt
