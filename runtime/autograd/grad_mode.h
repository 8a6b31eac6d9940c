// Thread-local switch for graph recording (the `no_grad` scope).
#pragma once

namespace bt {

class GradMode {
 public:
  static bool enabled();
  static void set_enabled(bool on);
};

/// Disables graph recording for its scope: ops run but record no backward.
class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace bt
