#include "launcher/progress.h"

#include <cerrno>
#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>
#ifdef BT_CUDA
#include <cuda_runtime.h>
#endif

#include "kernels/common/error.h"

namespace bt::launcher {

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  return u == 0 ? fmt::format("{} B", b)
                : fmt::format("{:.{}f} {}", v,
                              v < 10    ? 2
                              : v < 100 ? 1
                                        : 0,
                              units[u]);
}

std::string human_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<int64_t>(std::llround(s));
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, t % 3600 / 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

std::optional<double> peak_flops(const Device& d, Precision p) {
#ifdef BT_CUDA
  if (!d.is_cuda()) return std::nullopt;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, d.index) != cudaSuccess) return std::nullopt;
  const std::string name = prop.name;
  // Dense tensor-core peaks (bf16 / tf32) and the fp32 SIMT peak, SXM parts.
  // fp32x3 spends three TF32 products on each matmul FLOP (Note [3xTF32] in
  // kernels/gemm.h): its peak is a third of tf32's.
  struct Peak {
    const char* tag;
    double bf16, tf32, fp32;
  };
  const Peak peaks[] = {
      {"H200", 989e12, 494e12, 67e12}, {"H100", 989e12, 494e12, 67e12}, {"A100", 312e12, 156e12, 19.5e12}};
  for (const Peak& k : peaks) {
    if (name.find(k.tag) == std::string::npos) continue;
    switch (p) {
      case Precision::BF16:
        return k.bf16;
      case Precision::TF32:
        return k.tf32;
      case Precision::FP32X3:
        return k.tf32 / 3;
      case Precision::FP32:
        return k.fp32;
    }
  }
#else
  (void)d;
  (void)p;
#endif
  return std::nullopt;
}

Progress::Progress(int64_t total, int64_t log_every, double flops_per_token, std::optional<double> peak,
                   FILE* out)
    : total_(total),
      log_every_(log_every),
      flops_per_token_(flops_per_token),
      peak_(peak),
      out_(out),
      tty_(isatty(fileno(out)) != 0) {}

Progress::~Progress() { end_live_line(); }

void Progress::end_live_line() {
  if (live_) std::fputc('\n', out_);
  live_ = false;
  std::fflush(out_);
}

void Progress::print(const std::string& line) {
  end_live_line();
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

double Progress::mean_tokens_per_s() const {
  return steady_seconds_ > 0 ? static_cast<double>(steady_tokens_) / steady_seconds_ : 0.0;
}

void Progress::on_step(const train::StepStats& s) {
  elapsed_ += s.seconds;
  if (s.step > 1) {
    steady_seconds_ += s.seconds;
    steady_tokens_ += s.tokens;
  }
  const double rate = s.step > 1 ? mean_tokens_per_s() : s.tokens_per_s;
  const double eta = rate > 0 ? static_cast<double>((total_ - s.step) * s.tokens) / rate : 0.0;
  std::string line =
      fmt::format("step {:>{}}/{} | loss {:.4f} | lr {:.2e} | norm {:.3f} | {:.0f} tok/s", s.step,
                  std::to_string(total_).size(), total_, s.loss, s.lr, s.grad_norm, s.tokens_per_s);
  if (peak_ && flops_per_token_ > 0)
    line += fmt::format(" | MFU {:.1f}%", 100.0 * s.tokens_per_s * flops_per_token_ / *peak_);
  line += fmt::format(" | mem {} | ETA {}", human_bytes(s.peak_mem_bytes), human_duration(eta));
  if (tty_) {
    std::fprintf(out_, "\r\033[K%s", line.c_str());
    live_ = true;
    if (s.step == total_) end_live_line();
    std::fflush(out_);
  } else if (s.step % log_every_ == 0 || s.step == 1 || s.step == total_) {
    print(line);
  }
}

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  if (path.empty()) return;
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  BT_CHECK(f_ != nullptr, "cannot create the metrics file '", path, "': ", std::strerror(errno),
           "; check that its folder exists and is writable");
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::write(const train::StepStats& s, std::optional<double> val_loss) {
  if (!f_) return;
  nlohmann::ordered_json j;
  j["step"] = s.step;
  j["loss"] = s.loss;
  j["lr"] = s.lr;
  j["grad_norm"] = s.grad_norm;
  j["tokens_per_s"] = s.tokens_per_s;
  j["peak_mem_bytes"] = s.peak_mem_bytes;
  j["step_seconds"] = s.seconds;
  j["optimizer_state_bytes"] = s.optimizer_state_bytes;
  j["gradient_bytes"] = s.gradient_bytes;
  j["parameter_bytes"] = s.parameter_bytes;
  j["compute_copy_bytes"] = s.compute_copy_bytes;
  j["skipped"] = s.skipped;  // Note [Non-finite steps] in runtime/train/trainer.cpp
  if (s.skipped) j["nonfinite"] = s.nonfinite;
  if (s.compiled) {  // train.compile (docs/compiler.md)
    j["compile_s"] = s.compile_s;
    j["fused_groups"] = s.fused_groups;
    j["recompiles"] = s.recompiles;
    j["kernels_compiled"] = s.kernels_compiled;
    j["kernels_loaded"] = s.kernels_loaded;
  }
  if (val_loss) j["val_loss"] = *val_loss;
  const std::string line = j.dump() + "\n";
  BT_CHECK(std::fputs(line.c_str(), f_) >= 0 && std::fflush(f_) == 0, "cannot write the metrics file '",
           path_, "': ", std::strerror(errno));
}

}  // namespace bt::launcher
