// The process-wide precision policy, one runtime setting:
//   fp32    strict float32 math everywhere (no TF32): fp32 operands as they
//           are; on Hopper the GEMMs sum their exact products in fp64 on
//           the FP64 tensor cores and round once (Note [Strict fp32 on the
//           FP64 tensor cores] in kernels/gemm.h)
//   tf32    float32 storage, TF32 tensor cores for matmuls and attention
//   fp32x3  float32 storage and accumulation, fp32-level accuracy; matmuls run
//           as error-compensated TF32 on the tensor cores (three TF32
//           products, Note [3xTF32] in kernels/gemm.h); attention and
//           everything else is strict fp32 (attention_math below)
//   bf16    bf16 compute with fp32 master weights and optimizer state (the
//           model/optimizer code reads this to decide what to cast)
#pragma once

#include <string_view>

#include "kernels/common/gemm_math.h"

namespace bt {

enum class Precision { FP32, TF32, FP32X3, BF16 };

Precision precision();
void set_precision(Precision p);
/// Parses "fp32", "tf32", "fp32x3", "bf16"; throws bt::Error naming the bad value.
Precision parse_precision(std::string_view s);
std::string_view precision_name(Precision p);
/// How `p` multiplies f32 matrices, in GEMMs and in attention alike: tf32 on
/// TF32 tensor cores, fp32x3 as 3xTF32, fp32 (and bf16's f32 leftovers) strictly.
kernels::GemmMath matmul_math(Precision p);
/// How `p` multiplies attention's f32 products (Note [Attention in fp32] in
/// kernels/attention.h), by the mode in BT_ATTENTION_MATH (read once):
///   auto (or unset)    tf32 on the TF32 tensor cores, every other precision
///                      strictly. fp32x3's attention stays strict: its 3xTF32
///                      kernels measured no faster than the strict ones on an
///                      H100 (38.0 / 25.0 TFLOP/s forward / backward against
///                      34.5 / 25.4, bench/RESULTS.md) and less accurate;
///   strict             strictly, in every precision;
///   matmul             as the GEMMs multiply (matmul_math), fp32x3's 3xTF32
///                      included: to measure those kernels in training.
/// Another value is an error that names the variable.
kernels::GemmMath attention_math(Precision p);
/// The same for an explicit mode ("" is auto).
kernels::GemmMath attention_math(Precision p, std::string_view mode);

}  // namespace bt
