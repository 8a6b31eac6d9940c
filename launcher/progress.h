// Progress display for training: one live line rewritten in place on a
// terminal, plain lines every `log_every` steps otherwise; plus the metrics
// JSONL writer (one object per step) and small formatting helpers.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "runtime/core/device.h"
#include "runtime/core/precision.h"
#include "runtime/train/trainer.h"

namespace bt::launcher {

/// "1.5 GiB", "312 MiB", ...
std::string human_bytes(uint64_t b);
/// "1h02m", "3m07s", "12s".
std::string human_duration(double seconds);
/// Dense peak FLOP/s of device `d` at precision `p` for MFU, when known (H100,
/// H200, A100); nullopt otherwise.
std::optional<double> peak_flops(const Device& d, Precision p);

class Progress {
 public:
  /// `total` steps; `flops_per_token` for MFU (0 = none); output to `out`.
  Progress(int64_t total, int64_t log_every, double flops_per_token, std::optional<double> peak,
           FILE* out = stdout);
  ~Progress();
  void on_step(const train::StepStats& s);
  /// A line that must stay (validation loss, notes): ends any live line first.
  void print(const std::string& line);
  /// Mean tokens/s over the steps after the first (the first pays warmup).
  double mean_tokens_per_s() const;
  double elapsed() const { return elapsed_; }

 private:
  void end_live_line();
  int64_t total_, log_every_;
  double flops_per_token_;
  std::optional<double> peak_;
  FILE* out_;
  bool tty_;
  bool live_ = false;
  double elapsed_ = 0, steady_seconds_ = 0;
  int64_t steady_tokens_ = 0;
};

/// Appends one JSON object per line to a file; every line is flushed.
class MetricsWriter {
 public:
  /// Empty path = disabled; `append` keeps what the file holds (a resumed
  /// run). Throws bt::Error naming the path if it cannot be opened.
  explicit MetricsWriter(const std::string& path, bool append = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const train::StepStats& s, std::optional<double> val_loss);

 private:
  FILE* f_ = nullptr;
  std::string path_;
};

}  // namespace bt::launcher
