// The process-wide precision policy, one runtime setting:
//   fp32  strict float32 math everywhere (no TF32)
//   tf32  float32 storage, TF32 tensor cores for matmuls
//   bf16  bf16 compute with fp32 master weights and optimizer state (the
//         model/optimizer code reads this to decide what to cast)
#pragma once

#include <string_view>

namespace bt {

enum class Precision { FP32, TF32, BF16 };

Precision precision();
void set_precision(Precision p);
/// Parses "fp32", "tf32", "bf16"; throws bt::Error naming the bad value.
Precision parse_precision(std::string_view s);
std::string_view precision_name(Precision p);

}  // namespace bt
