// The process-wide precision policy, one runtime setting:
//   fp32    strict float32 math everywhere (no TF32)
//   tf32    float32 storage, TF32 tensor cores for matmuls
//   fp32x3  float32 storage and accumulation, fp32-level accuracy; matmuls run
//           as error-compensated TF32 on the tensor cores (three TF32
//           products, Note [3xTF32] in kernels/gemm.h); everything else,
//           attention included, is strict fp32
//   bf16    bf16 compute with fp32 master weights and optimizer state (the
//           model/optimizer code reads this to decide what to cast)
#pragma once

#include <string_view>

namespace bt {

enum class Precision { FP32, TF32, FP32X3, BF16 };

Precision precision();
void set_precision(Precision p);
/// Parses "fp32", "tf32", "fp32x3", "bf16"; throws bt::Error naming the bad value.
Precision parse_precision(std::string_view s);
std::string_view precision_name(Precision p);

}  // namespace bt
