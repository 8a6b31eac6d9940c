#include "compiler/cuda_template.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "compiler/cuda_func_emitter.h"
#include "compiler/mlir_text.h"
#include "kernels/common/dtype.h"
#include "kernels/common/error.h"

namespace bt::compiler {

// Note [CUDA templates]
// convert-parallel-loops-to-gpu on the CPU path's loops reached 71% of copy
// bandwidth for an f32 bias+GELU on an H100, 43% in bf16 (scalar 2-byte
// loads) and 7% for a row sum (one thread per row; issue 19). The templates
// write each kernel of a plan (Note [CUDA kernel plans]) directly as a
// gpu.func over static memrefs passed as bare pointers:
//   - every value is computed in f32; a bf16 node rounds once (truncf then
//     extf, cvt.rn.bf16.f32), as the eager ops do; constants are f32 bit
//     patterns of the node's rounded value;
//   - a bf16 tanh is the hardware's tanh.approx.f32 (one MUFU op; largest
//     relative error 2^-10.99), not libdevice's tanhf (22 PTX instructions
//     an element, which made a bf16 bias+GELU compute-bound at 0.65x of copy
//     bandwidth on an H200). Rounded to bf16 (8 bits) right after, it differs
//     from the eager op by one bf16 unit where tanhf's value lies within that
//     error of a rounding midpoint; an f32 tanh stays tanhf;
//   - a power by the constant 2, -1 or 0.5 is one multiply, divide or
//     square root (each correctly rounded), not libdevice's powf (a log, an
//     exp and their corrections): SwiGLU's backward, whose sigmoid is
//     (1 + exp(-g))^-1, went from 113 to 77 us a block at llama-150m's
//     [16, 1024, 2048] on an H200;
//   - pointwise and rows kernels move V elements per access: V = 8 when the
//     kernel touches bf16, else 4 (16 bytes of the narrowest type), halved
//     until it divides the innermost dim. An operand that varies along the
//     innermost dim is a memref of vector<V x T>, so NVPTX emits one 16-byte
//     ld/st.global.v4 per access; one that is broadcast along it is read as a
//     scalar and splat;
//   - an input is addressed through its broadcast strides in the kernel's
//     space (compiler/cuda_plan.h: broadcast_strides), so parameters ([C]),
//     row statistics ([R, 1]) and 0-d values need no copies; an input whose
//     node records a layout (Node::strides: a narrowed half of a head dim, an
//     expanded view) through those strides, read in place; it is read in
//     vectors when its innermost stride is 1 and the others are multiples of
//     V;
//   - block reductions: each thread folds its vectors in a loop, then the
//     lanes of a vector in order, a butterfly of gpu.shuffle xor in the warp,
//     one value per warp through shared memory, and every thread adds the warp
//     values in the same order (so every thread holds the same bits, and the
//     next phase needs no broadcast); a barrier closes each phase;
//   - column reductions: pass 1 is blocks of 32 columns x 8 row lanes (256 x 1
//     for a whole-tensor sum) over chunks of rows, folding over the row lanes
//     in shared memory into one partial per block and column (scratch);
//     pass 2 sums a column's partials in order and computes the outputs.
// The runtime checks at launch that each vector operand is 16-byte aligned
// (an input without a recorded layout that is not is copied first, one with
// a layout makes the group run eagerly that once; compiler/mlir_backend.cpp).

namespace {

using fusion::Group;
using fusion::Node;
using fusion::Op;

constexpr unsigned kPointwiseBlock = 256;
constexpr unsigned kColumnTile = 32, kColumnBlock = 256;

bool touches_bf16(const Group& g, const KernelPlan& kp) {
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (kp.used[i] && g.nodes[i].dtype == DType::BF16) return true;
  return false;
}

/// The leaves (node indices) the kernel reads: its inputs in argument order, then its staged outputs.
std::vector<int> used_inputs(const Group& g, const KernelPlan& kp) {
  std::vector<int> in;
  for (int n : g.inputs())
    if (kp.used[static_cast<size_t>(n)]) in.push_back(n);
  for (int n : g.outputs)
    if (kp.staged[static_cast<size_t>(n)]) in.push_back(n);
  return in;
}

struct Signature {
  std::string params;
  std::vector<CudaArg> args;
  std::vector<int> align;
};

/// The parameters: the inputs used, then the kernel's outputs (`outs`), then `scratch` if >= 0.
Signature signature(FuncEmitter& f, const Group& g, const KernelPlan& kp, const std::vector<int>& in,
                    const std::vector<bool>& out_full, int scratch, int64_t scratch_size, int v) {
  Signature s;
  const auto add = [&](const std::string& p, CudaArg a, int al) {
    s.params += (s.params.empty() ? "" : ", ") + p;
    s.args.push_back(a);
    s.align.push_back(al);
  };
  for (int n : in) {
    const Node& nd = g.nodes[static_cast<size_t>(n)];
    const CudaArg arg =
        nd.op == Op::Input
            ? CudaArg{CudaArg::Input, nd.input}
            : CudaArg{CudaArg::Output,
                      static_cast<int>(std::find(g.outputs.begin(), g.outputs.end(), n) - g.outputs.begin())};
    add(f.input_name(n) + ": " + f.input_type(n), arg,
        f.vector_input(n) ? static_cast<int>(dtype_size(nd.dtype)) * v : 0);
  }
  for (size_t j = 0; j < kp.outputs.size(); ++j) {
    const int n = g.outputs[static_cast<size_t>(kp.outputs[j])];
    const bool full = out_full[j] && v > 1;
    add("%out" + std::to_string(kp.outputs[j]) + ": " + f.output_type(n, full),
        {CudaArg::Output, kp.outputs[j]},
        full ? static_cast<int>(dtype_size(g.nodes[static_cast<size_t>(n)].dtype)) * v : 0);
  }
  if (scratch >= 0)
    add("%scratch: memref<" + std::to_string(scratch_size) + "xf32>", {CudaArg::Scratch, scratch}, 0);
  return s;
}

unsigned blocks(int64_t work, int64_t per_block) {
  const int64_t b = (work + per_block - 1) / per_block;
  BT_CHECK(b < (int64_t{1} << 31), "CUDA kernel plan: ", b, " blocks exceed the grid's limit");
  return static_cast<unsigned>(std::max<int64_t>(b, 1));
}

/// V: 8 lanes when bf16 is touched, else 4, halved until it divides the
/// innermost extent and every stride of an input with a recorded layout that
/// varies along it (so each of its reads is one vector or one splat value).
int vector_width(const Group& g, const KernelPlan& kp) {
  int v = touches_bf16(g, kp) ? 8 : 4;
  const int64_t inner = kp.space.empty() ? 1 : kp.space.back();
  const auto fits = [&](int w) {
    if (inner % w != 0) return false;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& nd = g.nodes[i];
      if (!kp.used[i] || nd.op != Op::Input || nd.strides.empty()) continue;
      const std::vector<int64_t> st = leaf_strides(nd, kp.space);
      if (st.empty() || st.back() == 0) continue;
      for (size_t k = 0; k + 1 < st.size(); ++k)
        if (st[k] % w != 0) return false;
    }
    return true;
  };
  while (v > 1 && !fits(v)) v /= 2;
  return v;
}

class ProgramBuilder {
 public:
  ProgramBuilder(const Group& g, const CudaPlan& plan, const std::string& func)
      : g_(g), plan_(plan), func_(func) {}

  CudaProgram build() {
    os_ << "module attributes {gpu.container_module} {\n  gpu.module @bt_fused {\n";
    for (size_t k = 0; k < plan_.kernels.size(); ++k) {
      const KernelPlan& kp = plan_.kernels[k];
      const std::string name = func_ + "_" + std::to_string(k);
      if (!prog_.summary.empty()) prog_.summary += " + ";
      prog_.summary += std::string(pattern_name(kp.pattern)) + shape_str(kp.space);
      if (kp.pattern == Pattern::Pointwise) pointwise(kp, name);
      if (kp.pattern == Pattern::Rows) rows(kp, name);
      if (kp.pattern == Pattern::Columns) columns(kp, name);
    }
    os_ << "  }\n}\n";
    prog_.module = os_.str();
    return prog_;
  }

 private:
  int output_node(int pos) const { return g_.outputs[static_cast<size_t>(pos)]; }

  void begin(const std::string& name, const Signature& s, const std::string& shared) {
    os_ << "    gpu.func @" << name << "(" << s.params << ")";
    if (!shared.empty()) os_ << " workgroup(%sh : " << shared << ")";
    os_ << " kernel {\n";
  }
  void end() { os_ << "      gpu.return\n    }\n"; }

  void pointwise(const KernelPlan& kp, const std::string& name) {
    const int v = vector_width(g_, kp);
    FuncEmitter f(os_, g_, kp, v);
    const std::vector<bool> full(kp.outputs.size(), true);
    const Signature s = signature(f, g_, kp, used_inputs(g_, kp), full, -1, 0, v);
    begin(name, s, "");
    const int64_t nv = shape_numel(kp.space) / v;
    const std::string bid = f.fresh(), tid = f.fresh();
    f.line(bid + " = gpu.block_id x");
    f.line(tid + " = gpu.thread_id x");
    const std::string i = f.op("arith.addi", f.op("arith.muli", bid, f.index(kPointwiseBlock)), tid);
    const std::string live = f.fresh();
    f.line(live + " = arith.cmpi ult, " + i + ", " + f.index(nv) + " : index");
    for (int pos : kp.outputs) f.hoist_uniforms(output_node(pos), i);  // values of constants alone
    f.open("scf.if " + live + " {");
    const std::string e = v == 1 ? i : f.op("arith.muli", i, f.index(v));
    std::map<int, std::string> memo;
    for (int pos : kp.outputs) {
      const int n = output_node(pos);
      const std::string x = f.narrow(f.full(n, e, memo), g_.nodes[static_cast<size_t>(n)].dtype, v);
      f.line("memref.store " + x + ", %out" + std::to_string(pos) + "[" + i +
             "] : " + f.output_type(n, true));
    }
    f.close();
    end();
    prog_.launches.push_back(
        {name, {blocks(nv, kPointwiseBlock), 1, 1}, {kPointwiseBlock, 1, 1}, s.args, s.align});
  }

  void rows(const KernelPlan& kp, const std::string& name) {
    const int v = vector_width(g_, kp);
    FuncEmitter f(os_, g_, kp, v);
    int64_t c = 1;
    for (size_t d = static_cast<size_t>(kp.split); d < kp.space.size(); ++d) c *= kp.space[d];
    const int64_t r = shape_numel(kp.space) / c, nv = c / v;
    const auto threads = static_cast<unsigned>(std::clamp<int64_t>((nv + 31) / 32 * 32, 32, 512));
    std::vector<bool> full;
    for (int pos : kp.outputs) {
      const Node& nd = g_.nodes[static_cast<size_t>(output_node(pos))];
      const bool fl = shape_numel(nd.shape) == shape_numel(kp.space);  // a row value broadcast over it, too
      BT_CHECK(fl || (shape_numel(nd.shape) == r &&
                      kp.level[static_cast<size_t>(output_node(pos))] != Level::Full),
               "fusion group '", g_.name, "': output ", pos, " of shape ", shape_str(nd.shape),
               " is neither the rows' ", shape_str(kp.space), " nor one value per row");
      full.push_back(fl);
    }
    const Signature s = signature(f, g_, kp, used_inputs(g_, kp), full, -1, 0, v);
    const std::string shared =
        "memref<" + std::to_string(threads / 32) + "xf32, #gpu.address_space<workgroup>>";
    f.set_shared(shared);
    begin(name, s, shared);
    const std::string row = f.fresh(), tid = f.fresh();
    f.line(row + " = gpu.block_id x");
    f.line(tid + " = gpu.thread_id x");
    const std::string base = f.op("arith.muli", row, f.index(c));
    const auto loop_element = [&](const std::string& j) {
      return f.op("arith.addi", base, v == 1 ? j : f.op("arith.muli", j, f.index(v)));
    };
    for (int red : kp.reductions) {
      const Node& rn = g_.nodes[static_cast<size_t>(red)];
      const int arg = plan_.reduce_base[static_cast<size_t>(red)];
      f.hoist_uniforms(arg, base);
      const std::string init = f.identity(rn.op), j = f.fresh(), acc = f.fresh(), out = f.fresh();
      f.open(out + " = scf.for " + j + " = " + tid + " to " + f.index(nv) + " step " + f.index(threads) +
             " iter_args(" + acc + " = " + init + ") -> (f32) {");
      std::map<int, std::string> memo;
      const std::string x = f.lanes(rn.op, f.full(arg, loop_element(j), memo));
      f.line("scf.yield " + f.combine(rn.op, acc, x) + " : f32");
      f.close();
      f.set_uniform(red, f.round(f.block_reduce(rn.op, out, tid, threads), rn.dtype, 1));
    }
    bool any_full = false;
    for (size_t j = 0; j < kp.outputs.size(); ++j) {
      if (full[j]) {
        f.hoist_uniforms(output_node(kp.outputs[j]), base);
        any_full = true;
      } else {
        f.uniform(output_node(kp.outputs[j]), base);
      }
    }
    if (any_full) {
      const std::string j = f.fresh();
      f.open("scf.for " + j + " = " + tid + " to " + f.index(nv) + " step " + f.index(threads) + " {");
      const std::string e = loop_element(j);
      const std::string at = v == 1 ? e : f.op("arith.divui", e, f.index(v));
      std::map<int, std::string> memo;
      for (size_t k = 0; k < kp.outputs.size(); ++k) {
        if (!full[k]) continue;
        const int n = output_node(kp.outputs[k]);
        const std::string x = f.narrow(f.full(n, e, memo), g_.nodes[static_cast<size_t>(n)].dtype, v);
        f.line("memref.store " + x + ", %out" + std::to_string(kp.outputs[k]) + "[" + at +
               "] : " + f.output_type(n, v > 1));
      }
      f.close();
    }
    const std::string first = f.fresh();
    f.line(first + " = arith.cmpi eq, " + tid + ", " + f.index(0) + " : index");
    f.open("scf.if " + first + " {");
    for (size_t k = 0; k < kp.outputs.size(); ++k) {
      if (full[k]) continue;
      const int n = output_node(kp.outputs[k]);
      const std::string x = f.narrow(f.uniform(n, base), g_.nodes[static_cast<size_t>(n)].dtype, 1);
      f.line("memref.store " + x + ", %out" + std::to_string(kp.outputs[k]) + "[" + row +
             "] : " + f.output_type(n, false));
    }
    f.close();
    end();
    prog_.launches.push_back({name, {blocks(r, 1), 1, 1}, {threads, 1, 1}, s.args, s.align});
  }

  void columns(const KernelPlan& kp, const std::string& name) {
    int64_t c = 1;
    for (size_t d = static_cast<size_t>(kp.split); d < kp.space.size(); ++d) c *= kp.space[d];
    const int64_t r = shape_numel(kp.space) / c;
    // Pass 1 reads V adjacent columns per thread; a value that is the same down
    // a column (a parameter) is then per lane too: Full in that pass.
    KernelPlan wide = kp;
    const int v = c > 1 ? vector_width(g_, kp) : 1;
    for (Level& l : wide.level)
      if (l == Level::Uniform) l = Level::Full;
    const int64_t cv = c / v;  // column vectors
    const unsigned tx = cv > 1 ? kColumnTile : 1, ty = kColumnBlock / tx;
    const int64_t tiles = (cv + tx - 1) / tx;
    const int64_t splits =
        std::clamp<int64_t>((2048 + tiles - 1) / tiles, 1, std::min<int64_t>(256, (r + ty - 1) / ty));
    const auto nred = static_cast<int64_t>(kp.reductions.size());
    const int scratch = static_cast<int>(prog_.scratch_f32.size());
    const int64_t scratch_n = nred * splits * c;
    prog_.scratch_f32.push_back(scratch_n);
    const std::string scratch_t = "memref<" + std::to_string(scratch_n) + "xf32>";
    for (int pos : kp.outputs)
      BT_CHECK(shape_numel(g_.nodes[static_cast<size_t>(output_node(pos))].shape) == c, "fusion group '",
               g_.name, "': output ", pos, " is not one value per column");
    const std::vector<int> in = used_inputs(g_, kp);
    {  // pass 1: partial sums per (row chunk, column), V columns per thread
      KernelPlan none = wide;
      none.outputs.clear();
      FuncEmitter f(os_, g_, wide, v);
      const std::string& lt = f.lanes_type();
      const Signature s = signature(f, g_, none, in, {}, scratch, scratch_n, v);
      const std::string sh =
          "memref<" + std::to_string(nred * kColumnBlock * v) + "xf32, #gpu.address_space<workgroup>>";
      begin(name + "_p1", s, sh);
      const std::string bx = f.fresh(), by = f.fresh(), x = f.fresh(), y = f.fresh();
      f.line(bx + " = gpu.block_id x");
      f.line(by + " = gpu.block_id y");
      f.line(x + " = gpu.thread_id x");
      f.line(y + " = gpu.thread_id y");
      const std::string colv = f.op("arith.addi", f.op("arith.muli", bx, f.index(tx)), x);
      const std::string clamped =
          f.op("arith.minui", colv, f.index(cv - 1));  // dead lanes read the last vector
      const std::string col0 = v == 1 ? clamped : f.op("arith.muli", clamped, f.index(v));
      const std::string r0 = f.op("arith.addi", f.op("arith.muli", by, f.index(ty)), y);
      std::vector<std::string> acc, init;
      std::string iter, types;
      for (size_t k = 0; k < kp.reductions.size(); ++k) {
        acc.push_back(f.fresh());
        init.push_back(f.identity_lanes(g_.nodes[static_cast<size_t>(kp.reductions[k])].op));
        iter += (k ? ", " : "") + acc[k] + " = " + init[k];
        types += (k ? ", " : "") + lt;
      }
      const std::string rr = f.fresh(), res = f.fresh();
      f.open(res + ":" + std::to_string(nred) + " = scf.for " + rr + " = " + r0 + " to " + f.index(r) +
             " step " + f.index(splits * ty) + " iter_args(" + iter + ") -> (" + types + ") {");
      const std::string e = f.op("arith.addi", f.op("arith.muli", rr, f.index(c)), col0);
      std::map<int, std::string> memo;
      std::string yields;
      for (size_t k = 0; k < kp.reductions.size(); ++k) {
        const int red = kp.reductions[k];
        const std::string val = f.full(plan_.reduce_base[static_cast<size_t>(red)], e, memo);
        yields += (k ? ", " : "") + f.combine(g_.nodes[static_cast<size_t>(red)].op, acc[k], val, lt);
      }
      f.line("scf.yield " + yields + " : " + types);
      f.close();
      // Shared memory: [reduction][row lane][column lane][V].
      const auto slot = [&](int64_t k, const std::string& row_lane) {
        return f.op(
            "arith.addi",
            f.op("arith.muli", f.op("arith.addi", f.op("arith.muli", row_lane, f.index(tx)), x), f.index(v)),
            f.index(k * kColumnBlock * v));
      };
      const auto load = [&](const std::string& mem, const std::string& type, const std::string& at) {
        const std::string val = f.fresh();
        f.line(val + " = " +
               (v == 1 ? "memref.load " + mem + "[" + at + "] : " + type
                       : "vector.load " + mem + "[" + at + "] : " + type + ", " + lt));
        return val;
      };
      const auto store = [&](const std::string& val, const std::string& mem, const std::string& type,
                             const std::string& at) {
        f.line((v == 1 ? "memref.store " + val + ", " + mem + "[" + at + "] : " + type
                       : "vector.store " + val + ", " + mem + "[" + at + "] : " + type + ", " + lt));
      };
      for (int64_t k = 0; k < nred; ++k) store(res + "#" + std::to_string(k), "%sh", sh, slot(k, y));
      f.line("gpu.barrier");
      const std::string lead = f.fresh(), in_range = f.fresh(), both = f.fresh();
      f.line(lead + " = arith.cmpi eq, " + y + ", " + f.index(0) + " : index");
      f.line(in_range + " = arith.cmpi ult, " + colv + ", " + f.index(cv) + " : index");
      f.line(both + " = arith.andi " + lead + ", " + in_range + " : i1");
      f.open("scf.if " + both + " {");
      const std::string col = v == 1 ? colv : f.op("arith.muli", colv, f.index(v));
      for (int64_t k = 0; k < nred; ++k) {
        const Op red = g_.nodes[static_cast<size_t>(kp.reductions[static_cast<size_t>(k)])].op;
        const std::string j = f.fresh(), a = f.fresh(), sum = f.fresh(), i0 = f.identity_lanes(red);
        f.open(sum + " = scf.for " + j + " = " + f.index(0) + " to " + f.index(ty) + " step " + f.index(1) +
               " iter_args(" + a + " = " + i0 + ") -> (" + lt + ") {");
        const std::string val = load("%sh", sh, slot(k, j));
        f.line("scf.yield " + f.combine(red, a, val, lt) + " : " + lt);
        f.close();
        const std::string at = f.op(
            "arith.addi", f.op("arith.muli", f.op("arith.addi", by, f.index(k * splits)), f.index(c)), col);
        store(sum, "%scratch", scratch_t, at);
      }
      f.close();
      end();
      prog_.launches.push_back(
          {name + "_p1", {blocks(cv, tx), static_cast<unsigned>(splits), 1}, {tx, ty, 1}, s.args, s.align});
    }
    {  // pass 2: a warp per column folds its partials (lane-strided, then a butterfly), then its outputs
      FuncEmitter f(os_, g_, kp, 1);
      const std::vector<bool> full(kp.outputs.size(), false);
      const Signature s = signature(f, g_, kp, in, full, scratch, scratch_n, 1);
      begin(name + "_p2", s, "");
      constexpr unsigned kWarps = 8;
      const std::string bx = f.fresh(), x = f.fresh();
      f.line(bx + " = gpu.block_id x");
      f.line(x + " = gpu.thread_id x");
      const std::string c32 = f.index(32);
      const std::string lane = f.op("arith.remui", x, c32);
      const std::string col =
          f.op("arith.addi", f.op("arith.muli", bx, f.index(kWarps)), f.op("arith.divui", x, c32));
      const std::string live = f.fresh();
      f.line(live + " = arith.cmpi ult, " + col + ", " + f.index(c) + " : index");
      f.open("scf.if " + live + " {");  // whole warps agree: a column is one warp's
      for (int64_t k = 0; k < nred; ++k) {
        const int red = kp.reductions[static_cast<size_t>(k)];
        const Node& rn = g_.nodes[static_cast<size_t>(red)];
        const std::string j = f.fresh(), a = f.fresh(), sum = f.fresh(), i0 = f.identity(rn.op);
        f.open(sum + " = scf.for " + j + " = " + lane + " to " + f.index(splits) + " step " + f.index(32) +
               " iter_args(" + a + " = " + i0 + ") -> (f32) {");
        const std::string at = f.op(
            "arith.addi", f.op("arith.muli", f.op("arith.addi", j, f.index(k * splits)), f.index(c)), col);
        const std::string val = f.fresh();
        f.line(val + " = memref.load %scratch[" + at + "] : " + scratch_t);
        f.line("scf.yield " + f.combine(rn.op, a, val) + " : f32");
        f.close();
        f.set_uniform(red, f.round(f.warp_reduce(rn.op, sum), rn.dtype, 1));
      }
      std::vector<std::string> vals;
      for (int pos : kp.outputs) {
        const int n = output_node(pos);
        vals.push_back(f.narrow(f.uniform(n, col), g_.nodes[static_cast<size_t>(n)].dtype, 1));
      }
      const std::string first = f.fresh();
      f.line(first + " = arith.cmpi eq, " + lane + ", " + f.index(0) + " : index");
      f.open("scf.if " + first + " {");
      for (size_t k = 0; k < kp.outputs.size(); ++k)
        f.line("memref.store " + vals[k] + ", %out" + std::to_string(kp.outputs[k]) + "[" + col +
               "] : " + f.output_type(output_node(kp.outputs[k]), false));
      f.close();
      f.close();
      end();
      prog_.launches.push_back(
          {name + "_p2", {blocks(c, kWarps), 1, 1}, {32 * kWarps, 1, 1}, s.args, s.align});
    }
  }

  const Group& g_;
  const CudaPlan& plan_;
  std::string func_;
  std::ostringstream os_;
  CudaProgram prog_;
};

}  // namespace

CudaProgram cuda_program(const Group& g, const std::string& func) {
  CudaPlan plan;
  const std::string why = plan_cuda(g, &plan);
  BT_CHECK(why.empty(), why);
  return ProgramBuilder(g, plan, func).build();
}

}  // namespace bt::compiler
