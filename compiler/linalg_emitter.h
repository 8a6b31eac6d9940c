// A fusion group (runtime/compile/fusion_group.h) as MLIR 19 text: one
// func.func in destination-passing style, the group's math as linalg.generic
// ops on tensors. Plain C++ (no MLIR headers): the text is what the pass
// pipeline parses (compiler/cpu_jit.h) and what a dump shows.
//
// Note [Fusion groups in linalg]
// The function takes one memref per group input, then one per output, every
// one with a fully dynamic strided layout (so inputs may be any view), and
// returns nothing: each input enters as bufferization.to_tensor, each output
// leaves through bufferization.materialize_in_destination into its memref.
// Every computed node becomes its own linalg.generic over the node's shape
// (a reduction: over its argument's, with reduction iterators) writing into a
// tensor.empty; broadcasting is in the indexing maps (a size-1 dim of an
// argument reads index 0), scalars are arith.constant bit patterns of the
// node's dtype. The pipeline then fuses producers into consumers
// (linalg-fuse-elementwise-ops), turns the empty tensors of outputs into the
// output buffers (eliminate-empty-tensors) and bufferizes: an elementwise
// chain becomes one loop nest that writes its output in place, and only a
// value that several loop nests of different shapes read (a row mean feeding
// a normalization) gets a buffer of its own.
// Numerics follow the eager ops: a bf16 node computes in f32 and rounds once
// (arith.extf, the f32 op, then the eager rounding written out in integer ops,
// Note [bf16 rounding in integer ops]); a bf16 sum accumulates in f32; a
// cast from f64 to bf16 goes through f32, as the eager cast does; no fast-math
// flags, so nothing is contracted or reassociated.
//
// Note [Row sums in the eager order]
// A Sum over one dim that kernels/cpu/reduce.cpp treats as a row (no larger
// dim after it) is not emitted as one reduction loop: that would add in
// another order than the eager kernel, and over a long row (a gradient norm
// over a whole embedding) a plain f32 chain drifts by 1e-4 of the result.
// It follows sum_row instead: for each chunk of 4096, 8 partial sums over
// x[8 k + l] (a generic over (k, l) reading index 8 k + l, with a dummy
// operand that gives the k loop its trip count), combined as
// ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)), then the chunk's tail
// in order; the chunk sums added in f64, in order, and rounded once. Compiled
// and eager row sums then agree bit for bit (MlirBackend.RowSumsFollowTheEagerOrderBitForBit).
// Sums over other dims already agree: both add the rows in order.
#pragma once

#include <string>

#include "runtime/compile/fusion_group.h"

namespace bt::compiler {

/// The MLIR module text of `g` as the function `func` (a valid symbol name).
std::string to_linalg(const fusion::Group& g, const std::string& func);

}  // namespace bt::compiler
