#include "runtime/core/precision.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "kernels/common/error.h"

namespace bt {
namespace {
std::atomic<Precision> g_precision{Precision::FP32};
}

Precision precision() { return g_precision.load(); }
void set_precision(Precision p) { g_precision.store(p); }

Precision parse_precision(std::string_view s) {
  if (s == "fp32") return Precision::FP32;
  if (s == "tf32") return Precision::TF32;
  if (s == "fp32x3") return Precision::FP32X3;
  if (s == "bf16") return Precision::BF16;
  BT_FAIL("unknown precision '", s, "'; use fp32, tf32, fp32x3 or bf16");
}

std::string_view precision_name(Precision p) {
  switch (p) {
    case Precision::FP32:
      return "fp32";
    case Precision::TF32:
      return "tf32";
    case Precision::FP32X3:
      return "fp32x3";
    case Precision::BF16:
      return "bf16";
  }
  return "?";
}

kernels::GemmMath matmul_math(Precision p) {
  switch (p) {
    case Precision::TF32:
      return kernels::GemmMath::Tf32;
    case Precision::FP32X3:
      return kernels::GemmMath::Tf32x3;
    case Precision::FP32:
    case Precision::BF16:
      break;
  }
  return kernels::GemmMath::Strict;
}

kernels::GemmMath attention_math(Precision p, std::string_view mode) {
  if (mode.empty() || mode == "auto") return p == Precision::TF32 ? kernels::GemmMath::Tf32 : kernels::GemmMath::Strict;
  if (mode == "strict") return kernels::GemmMath::Strict;
  BT_CHECK(mode == "matmul", "BT_ATTENTION_MATH='", mode, "': use auto (the default), strict or matmul");
  return matmul_math(p);
}

kernels::GemmMath attention_math(Precision p) {
  static const std::string mode = [] {
    const char* v = std::getenv("BT_ATTENTION_MATH");
    return std::string(v ? v : "");
  }();
  return attention_math(p, mode);
}

}  // namespace bt
