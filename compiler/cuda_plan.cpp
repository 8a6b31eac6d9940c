#include "compiler/cuda_plan.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "kernels/common/error.h"

namespace bt::compiler {

// Note [CUDA kernel plans]
// A fusion group is a DAG of elementwise ops and reductions. On the GPU it
// runs as a few kernels, each of one pattern with a codegen template
// (compiler/cuda_template.cpp) that reaches memory bandwidth:
//   pointwise  no reduction; one thread per 16-byte vector of the outputs;
//   rows       reductions over the trailing dims [split, rank) of one
//              shape (LayerNorm's mean and variance): one block per row, each
//              reduction a loop over the row and a shuffle + shared-memory
//              reduction, the row's elements recomputed from the inputs in
//              each loop (they are in L1/L2), then the row's outputs;
//   columns    reductions over the leading dims [0, split) (bias and
//              LayerNorm-weight gradients; [0, rank): a whole-tensor sum such
//              as a gradient's squared norm): a first pass of blocks over row
//              chunks writes partial sums, a second sums them in order.
// Chains of one reduction kind (sum over dims [1] then [0], keepdim, the
// intermediate used by nothing else) merge into one reduction over the union
// of their dims before classification. Every output is classified by the
// reductions in its cone: none, all rows of one (space, split), all columns
// of one (space, split); outputs of the same class share a kernel; a column
// kernel's outputs must be column values (a value over the full space that
// depends on a column sum would need a third pass). Each kernel recomputes its
// cone from the group's inputs, so any intermediate shared between kernels is
// computed twice rather than stored -- except where an output's cone holds
// reductions of two kinds (a column sum of a value a row reduction made, as
// autograd records LayerNorm's backward): there the group's other outputs
// that carry the first kind are read back from memory ("staged"), and the
// kernels that write them run first. A columns kernel also reads back a
// full-size output another kernel writes when recomputing it would read at
// least as many bytes an element (a bias gradient summed from GELU's backward
// reads dh, not h and dg, and runs no tanh); a value only widened from its
// inputs (a bf16 -> f32 cast) is still recomputed.
// Results are deterministic: fixed block shapes, fixed reduction orders, no
// atomics. They are not the eager kernels' bits (the order of a sum and FMA
// contraction differ); tests hold them to tolerances.

const char* pattern_name(Pattern p) {
  switch (p) {
    case Pattern::Pointwise:
      return "pointwise";
    case Pattern::Rows:
      return "rows";
    case Pattern::Columns:
      return "columns";
  }
  return "?";
}

std::vector<int64_t> broadcast_strides(const Shape& shape, const Shape& space) {
  const size_t r = space.size();
  std::vector<int64_t> st(r, 0);
  BT_ASSERT(shape.size() <= r);
  int64_t s = 1;
  for (size_t k = 0; k < shape.size(); ++k) {
    const size_t src = shape.size() - 1 - k, dst = r - 1 - k;
    BT_ASSERT(shape[src] == space[dst] || shape[src] == 1);
    st[dst] = shape[src] == 1 ? 0 : s;
    s *= shape[src];
  }
  return st;
}

namespace {

using fusion::Group;
using fusion::Node;
using fusion::Op;

/// True when `shape` broadcasts to `space` (right-aligned).
bool broadcasts_to(const Shape& shape, const Shape& space) {
  if (shape.size() > space.size()) return false;
  for (size_t k = 0; k < shape.size(); ++k) {
    const int64_t a = shape[shape.size() - 1 - k], b = space[space.size() - 1 - k];
    if (a != b && a != 1) return false;
  }
  return true;
}

struct Reduction {
  int base = -1;              // the node reduced
  std::vector<int64_t> dims;  // over base's shape
};

/// Merges chains of one reduction kind whose intermediates are keepdim and
/// used only by the next link (Note [CUDA kernel plans]).
void merge_chains(const Group& g, CudaPlan* plan, std::vector<Reduction>* red) {
  const size_t n = g.nodes.size();
  std::vector<int> users(n, 0);
  for (const Node& nd : g.nodes)
    for (int a : nd.args) ++users[static_cast<size_t>(a)];
  for (int o : g.outputs) users[static_cast<size_t>(o)] += 1 << 20;  // an output is never absorbed
  plan->reduce_base.assign(n, -1);
  plan->absorbed.assign(n, false);
  red->assign(n, {});
  for (size_t i = 0; i < n; ++i) {
    const Node& nd = g.nodes[i];
    if (!fusion::is_reduction(nd.op)) continue;
    const int a = nd.args[0];
    const Node& an = g.nodes[static_cast<size_t>(a)];
    Reduction r{a, nd.dims};
    if (an.op == nd.op && an.keepdim && users[static_cast<size_t>(a)] == 1) {
      r = (*red)[static_cast<size_t>(a)];
      for (int64_t d : nd.dims) r.dims.push_back(d);  // keepdim: the same dims of the base
      std::sort(r.dims.begin(), r.dims.end());
      plan->absorbed[static_cast<size_t>(a)] = true;
    }
    (*red)[i] = r;
    plan->reduce_base[i] = r.base;
  }
}

struct Key {
  Pattern pattern;
  Shape space;
  int split;
  bool operator<(const Key& o) const {
    return std::tie(pattern, space, split) < std::tie(o.pattern, o.space, o.split);
  }
};

}  // namespace

std::string plan_cuda(const Group& g, CudaPlan* plan) {
  const std::string in = "fusion group '" + g.name + "': ";
  if (g.outputs.empty()) return in + "it has no outputs";
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].dtype != DType::F32 && g.nodes[i].dtype != DType::BF16)
      return in + "node " + std::to_string(i) + " is " + std::string(dtype_name(g.nodes[i].dtype)) +
             "; CUDA kernels are generated for f32 and bf16";
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (shape_numel(g.nodes[i].shape) == 0)
      return in + "node " + std::to_string(i) + " has no elements (shape " + shape_str(g.nodes[i].shape) +
             ")";
  std::vector<Reduction> red;
  merge_chains(g, plan, &red);
  plan->kernels.clear();

  // Each reduction's class, and each output's.
  const auto classify = [&](size_t i, Key* k) -> std::string {
    const Reduction& r = red[i];
    const Shape& s = g.nodes[static_cast<size_t>(r.base)].shape;
    const auto rank = static_cast<int64_t>(s.size());
    const auto nd = static_cast<int64_t>(r.dims.size());
    bool leading = true, trailing = true;
    for (int64_t j = 0; j < nd; ++j) {
      leading = leading && r.dims[static_cast<size_t>(j)] == j;
      trailing = trailing && r.dims[static_cast<size_t>(j)] == rank - nd + j;
    }
    if (leading) {  // a whole-tensor reduction is a column reduction with one column
      *k = {Pattern::Columns, s, static_cast<int>(nd)};
      return "";
    }
    if (trailing) {
      *k = {Pattern::Rows, s, static_cast<int>(rank - nd)};
      return "";
    }
    return in + "node " + std::to_string(i) + " reduces dims that are neither leading nor trailing";
  };
  // The reductions in the cone of `o` (through merged chains to their bases),
  // not looking past the nodes `stop` marks; `seen` gets the cone.
  const auto cone = [&](int o, const std::vector<bool>& stop, std::vector<bool>* seen,
                        std::vector<int>* reds) {
    seen->assign(g.nodes.size(), false);
    reds->clear();
    std::vector<int> stack{o};
    while (!stack.empty()) {
      const int v = stack.back();
      stack.pop_back();
      if ((*seen)[static_cast<size_t>(v)]) continue;
      (*seen)[static_cast<size_t>(v)] = true;
      if (v != o && stop[static_cast<size_t>(v)]) continue;
      const Node& nd = g.nodes[static_cast<size_t>(v)];
      if (fusion::is_reduction(nd.op)) {
        reds->push_back(v);
        stack.push_back(plan->reduce_base[static_cast<size_t>(v)]);
      } else {
        for (int a : nd.args) stack.push_back(a);
      }
    }
  };
  // The kernel class of those reductions; false when they disagree.
  std::string why;
  const auto class_of = [&](int o, const std::vector<int>& reds, Key* key) {
    *key = {Pattern::Pointwise, g.nodes[static_cast<size_t>(o)].shape, 0};
    for (size_t j = 0; j < reds.size(); ++j) {
      Key k;
      if (why = classify(static_cast<size_t>(reds[j]), &k); !why.empty()) return false;
      if (j > 0 && (k.pattern != key->pattern || k.space != key->space || k.split != key->split))
        return false;
      *key = k;
    }
    return true;
  };
  std::vector<bool> no_stop(g.nodes.size(), false), reducing_output(g.nodes.size(), false);
  for (int o : g.outputs) {
    std::vector<bool> seen;
    std::vector<int> reds;
    cone(o, no_stop, &seen, &reds);
    reducing_output[static_cast<size_t>(o)] = !reds.empty();
  }
  std::map<Key, size_t> kernel_of;
  std::vector<int> kernel_of_output(g.outputs.size(), -1);
  for (size_t pos = 0; pos < g.outputs.size(); ++pos) {
    const int o = g.outputs[pos];
    std::vector<bool> seen;
    std::vector<int> reds;
    cone(o, no_stop, &seen, &reds);
    Key key;
    std::vector<int> staged;
    if (!class_of(o, reds, &key)) {
      if (!why.empty()) return why;
      // Reductions of two kinds (a column sum of a value a row reduction made):
      // read the group's other outputs that carry the first kind from memory
      // (staged), computed by an earlier kernel.
      cone(o, reducing_output, &seen, &reds);
      if (!class_of(o, reds, &key)) {
        if (!why.empty()) return why;
        return in + "output " + std::to_string(pos) + " (node " + std::to_string(o) +
               ") depends on reductions of different kinds or shapes";
      }
      for (size_t v = 0; v < seen.size(); ++v)
        if (seen[v] && reducing_output[v] && static_cast<int>(v) != o) staged.push_back(static_cast<int>(v));
    }
    auto [it, fresh] = kernel_of.try_emplace(key, plan->kernels.size());
    if (fresh) {
      KernelPlan kp;
      kp.pattern = key.pattern;
      kp.space = key.space;
      kp.split = key.split;
      kp.used.assign(g.nodes.size(), false);
      kp.staged.assign(g.nodes.size(), false);
      plan->kernels.push_back(std::move(kp));
    }
    KernelPlan& kp = plan->kernels[it->second];
    kp.outputs.push_back(static_cast<int>(pos));
    kernel_of_output[pos] = static_cast<int>(it->second);
    for (size_t v = 0; v < seen.size(); ++v) kp.used[v] = kp.used[v] || seen[v];
    for (int v : staged) kp.staged[static_cast<size_t>(v)] = true;
  }
  // A pointwise kernel over a rows kernel's space joins it: the rows kernel's
  // last loop walks every element anyway, so its inputs are read once.
  for (size_t p = 0; p < plan->kernels.size(); ++p) {
    KernelPlan& pk = plan->kernels[p];
    if (pk.pattern != Pattern::Pointwise || pk.outputs.empty()) continue;
    for (size_t r = 0; r < plan->kernels.size(); ++r) {
      KernelPlan& rk = plan->kernels[r];
      if (rk.pattern != Pattern::Rows || rk.space != pk.space) continue;
      bool cycle = false;
      for (int pos : pk.outputs)
        cycle = cycle || rk.staged[static_cast<size_t>(g.outputs[static_cast<size_t>(pos)])];
      for (int pos : rk.outputs)
        cycle = cycle || pk.staged[static_cast<size_t>(g.outputs[static_cast<size_t>(pos)])];
      if (cycle) continue;
      for (int pos : pk.outputs) {
        rk.outputs.push_back(pos);
        kernel_of_output[static_cast<size_t>(pos)] = static_cast<int>(r);
      }
      std::sort(rk.outputs.begin(), rk.outputs.end());
      for (size_t v = 0; v < g.nodes.size(); ++v) {
        rk.used[v] = rk.used[v] || pk.used[v];
        rk.staged[v] = rk.staged[v] || pk.staged[v];
      }
      pk.outputs.clear();
      break;
    }
  }
  {  // drop the emptied kernels, renumbering kernel_of_output
    std::vector<KernelPlan> kept;
    std::vector<int> renumber(plan->kernels.size(), -1);
    for (size_t k = 0; k < plan->kernels.size(); ++k)
      if (!plan->kernels[k].outputs.empty()) {
        renumber[k] = static_cast<int>(kept.size());
        kept.push_back(std::move(plan->kernels[k]));
      }
    for (int& k : kernel_of_output) k = renumber[static_cast<size_t>(k)];
    plan->kernels = std::move(kept);
  }
  // A columns kernel reads back a full-size value another kernel writes
  // rather than recompute it, where that reads no more bytes (Note [CUDA
  // kernel plans]). Nodes go in order, so a staged value's own staged inputs
  // fall out of the cone and are unmarked below.
  {
    const size_t n = g.nodes.size();
    std::vector<int> writer(n, -1);
    for (size_t pos = 0; pos < g.outputs.size(); ++pos)
      writer[static_cast<size_t>(g.outputs[pos])] = kernel_of_output[pos];
    for (size_t k = 0; k < plan->kernels.size(); ++k) {
      KernelPlan& ck = plan->kernels[k];
      if (ck.pattern != Pattern::Columns) continue;
      const int64_t full = shape_numel(ck.space);
      bool changed = false;
      for (size_t v = 0; v < n; ++v) {
        const Node& nd = g.nodes[v];
        if (!ck.used[v] || ck.staged[v] || writer[v] < 0 || writer[v] == static_cast<int>(k) ||
            shape_numel(nd.shape) != full)
          continue;
        std::vector<bool> seen;
        std::vector<int> reds;
        cone(static_cast<int>(v), ck.staged, &seen, &reds);
        int64_t recompute_bytes = 0;  // per element: the full-size leaves recomputing v reads
        for (size_t u = 0; u < n; ++u)
          if (seen[u] && u != v && (g.nodes[u].op == Op::Input || ck.staged[u]) &&
              shape_numel(g.nodes[u].shape) == full)
            recompute_bytes += static_cast<int64_t>(dtype_size(g.nodes[u].dtype));
        if (static_cast<int64_t>(dtype_size(nd.dtype)) > recompute_bytes) continue;
        ck.staged[v] = true;
        changed = true;
      }
      if (!changed) continue;
      std::fill(ck.used.begin(), ck.used.end(), false);
      for (int pos : ck.outputs) {
        std::vector<bool> seen;
        std::vector<int> reds;
        cone(g.outputs[static_cast<size_t>(pos)], ck.staged, &seen, &reds);
        for (size_t v = 0; v < n; ++v) ck.used[v] = ck.used[v] || seen[v];
      }
      for (size_t v = 0; v < n; ++v) ck.staged[v] = ck.staged[v] && ck.used[v];
    }
  }
  // Kernels that read staged outputs run after the kernels that write them.
  {
    const size_t nk = plan->kernels.size();
    std::vector<std::vector<size_t>> after(nk);  // after[k]: kernels k must follow
    for (size_t k = 0; k < nk; ++k)
      for (size_t pos = 0; pos < g.outputs.size(); ++pos)
        if (plan->kernels[k].staged[static_cast<size_t>(g.outputs[pos])]) {
          const auto w = static_cast<size_t>(kernel_of_output[pos]);
          if (w == k)
            return in + "output " + std::to_string(pos) + " is both computed and read from memory by one " +
                   pattern_name(plan->kernels[k].pattern) + " kernel";
          after[k].push_back(w);
        }
    std::vector<KernelPlan> ordered;
    std::vector<bool> done(nk, false);
    while (ordered.size() < nk) {
      bool progress = false;
      for (size_t k = 0; k < nk; ++k) {
        if (done[k] || !std::all_of(after[k].begin(), after[k].end(), [&](size_t w) { return done[w]; }))
          continue;
        done[k] = progress = true;
        ordered.push_back(std::move(plan->kernels[k]));
      }
      if (!progress) return in + "its kernels read each other's outputs in a cycle";
    }
    plan->kernels = std::move(ordered);
  }

  // Levels, and the checks each pattern needs.
  for (KernelPlan& kp : plan->kernels) {
    kp.level.assign(g.nodes.size(), Level::Full);
    const size_t rank = kp.space.size();
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      if (!kp.used[i]) continue;
      const Node& nd = g.nodes[i];
      const std::string at = in + "node " + std::to_string(i) + " (" + fusion::op_name(nd.op) + ")";
      if (nd.op == Op::Scalar) {
        kp.level[i] = Level::Const;
        continue;
      }
      if (fusion::is_reduction(nd.op) && !kp.staged[i]) {
        if (plan->absorbed[i]) continue;
        kp.reductions.push_back(static_cast<int>(i));
        kp.level[i] = Level::Uniform;
        const bool last_use_only = !nd.keepdim;  // a value of a shape the kernel's space does not broadcast
        if (last_use_only)
          for (size_t j = i + 1; j < g.nodes.size(); ++j)
            if (kp.used[j] && std::count(g.nodes[j].args.begin(), g.nodes[j].args.end(), static_cast<int>(i)))
              return at + " drops its dims and is read by node " + std::to_string(j) +
                     "; CUDA kernels take keepdim reductions inside a group";
        continue;
      }
      if (!broadcasts_to(nd.shape, kp.space))
        return at + " has shape " + shape_str(nd.shape) + ", which does not broadcast to the kernel's " +
               shape_str(kp.space);
      if (nd.op == Op::Input || kp.staged[i]) {
        if (kp.pattern == Pattern::Pointwise) continue;  // Full: every input is indexed per element
        const std::vector<int64_t> st = broadcast_strides(nd.shape, kp.space);
        bool varies = false;  // along the extent a block or thread walks
        for (size_t d = 0; d < rank; ++d) {
          const bool inner = kp.pattern == Pattern::Rows ? d >= static_cast<size_t>(kp.split)
                                                         : d < static_cast<size_t>(kp.split);
          varies = varies || (inner && st[d] != 0);
        }
        kp.level[i] = varies ? Level::Full : Level::Uniform;
        continue;
      }
      Level l = Level::Const;
      for (int a : nd.args) l = std::max(l, kp.level[static_cast<size_t>(a)]);
      kp.level[i] = l;
    }
    if (kp.pattern == Pattern::Pointwise) continue;
    for (int r : kp.reductions)
      if (kp.level[static_cast<size_t>(plan->reduce_base[static_cast<size_t>(r)])] != Level::Full)
        return in + "node " + std::to_string(r) + " reduces a value that does not vary over its dims";
    if (kp.pattern == Pattern::Columns)
      for (int pos : kp.outputs)
        if (kp.level[static_cast<size_t>(g.outputs[static_cast<size_t>(pos)])] == Level::Full)
          return in + "output " + std::to_string(pos) +
                 " is a full-size value computed from a column reduction (a third pass; not templated)";
  }
  return "";
}

}  // namespace bt::compiler
