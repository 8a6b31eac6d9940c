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

/// Sets grad mode for its scope (a checkpointed region's rerun turns it on
/// inside a backward pass, which runs with it off).
class GradModeGuard {
 public:
  explicit GradModeGuard(bool on) : prev_(GradMode::enabled()) { GradMode::set_enabled(on); }
  ~GradModeGuard() { GradMode::set_enabled(prev_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace bt
