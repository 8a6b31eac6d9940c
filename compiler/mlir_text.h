// Pieces of MLIR text that the emitters share (compiler/linalg_emitter for
// the CPU, compiler/cuda_template for CUDA). Plain strings: no MLIR headers.
#pragma once

#include <string>
#include <vector>

#include "runtime/compile/fusion_group.h"

namespace bt::compiler {

/// MLIR's name of a fusion group's dtype (f32, f64, bf16: dtype_name's
/// spelling); throws bt::Error for another dtype.
const char* mlir_type(DType t);

/// `value` rounded to `t`, as an MLIR literal of its bits (exact).
std::string constant_bits(double value, DType t);

/// One line, `result = <op> args : type`, for an elementwise op of a fusion
/// group (Neg, Exp, Log, Tanh, Sqrt, Add, Sub, Mul, Div, Pow) on values of
/// MLIR type `type` (a scalar or a vector type), without indentation or newline.
std::string elementwise_op(fusion::Op op, const std::string& result, const std::vector<std::string>& args,
                           const std::string& type);

}  // namespace bt::compiler
