#include "runtime/compile/lazy.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "runtime/autograd/grad_mode.h"
#include "runtime/autograd/recompute.h"
#include "runtime/compile/fusion_backend.h"
#include "runtime/core/profiler.h"

namespace bt::fusion {
namespace {

/// One recorded op. Argument k is the pending node args[k], or (when that is
/// null) the materialized tensor inputs[k], or (Op::Scalar in `scalar_arg`)
/// the constant `value`.
struct LazyNode final : PendingValue {
  Op op = Op::Input;
  DType dtype = DType::F32;
  Shape shape;
  Device device;
  Stream stream;
  std::vector<std::shared_ptr<LazyNode>> args;
  std::vector<Tensor> inputs;
  bool scalar_arg = false;  // the second argument is the constant `value`
  double value = 0.0;       // lazy_scalar's constant
  DType scalar_dtype = DType::F32;
  int dim = -1;  // Sum
  std::weak_ptr<Storage> storage;
  // Note [Saved values recomputed]
  std::vector<uint64_t> input_versions;  // inputs[k]'s version when recorded
  struct Computed {                      // argument k once its group wrote it (args[k] is dropped then)
    std::shared_ptr<Storage> storage;
    uint64_t version = 0;
    Shape shape;
    DType dtype = DType::F32;
  };
  std::vector<Computed> computed;
  int depth = 1;                                // elementwise ops down to materialized data or a sum
  std::vector<std::shared_ptr<LazyNode>> sums;  // the pending sums reached through elementwise args
};

struct Context {
  std::mutex mu;
  std::vector<std::shared_ptr<LazyNode>> pending;
  std::atomic<int> scopes{0};  // read without the lock on every op (lazy_recording)
  LazyOptions opts;
  std::map<std::string, std::shared_ptr<Kernel>> kernels;  // by device + canonical text; null: failed
  LazyStats stats;
};

Context& ctx() {
  static Context* c = new Context;  // never destroyed: storages may flush during static destruction
  return *c;
}

thread_local int t_flushing = 0;  // recording is off while a flush runs (its kernels and eager fallbacks)

constexpr size_t kMaxPending = 4096;  // a longer region is computed in pieces

/// The type a scalar of an op on `t` is held in: f32 for bf16, as the kernels hold it.
DType compute_type(DType t) { return t == DType::BF16 ? DType::F32 : t; }

/// A contiguous tensor of `shape` and `dtype` over all of `st`.
Tensor tensor_over(std::shared_ptr<Storage> st, const Shape& shape, DType dtype, const Stream& stream) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(st);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->stream = stream;
  return Tensor(std::move(impl));
}

/// The storage of pending node `n`: the one its tensors share while any is
/// held, else a new one (holding it makes `n` an output of its group).
std::shared_ptr<Storage> storage_of(const std::shared_ptr<LazyNode>& n) {
  if (std::shared_ptr<Storage> st = n->storage.lock()) return st;
  auto st = std::make_shared<Storage>();
  st->device = n->device;
  st->nbytes = static_cast<size_t>(shape_numel(n->shape)) * dtype_size(n->dtype);
  st->pending = n;
  n->storage = st;
  return st;
}

Tensor rebuild(const std::shared_ptr<LazyNode>& n, bool root);

// Note [Saved values recomputed]
// A value autograd saves for backward is kept in memory until the backward
// reads it. Written from primitive ops, a block saves many: LayerNorm's
// centered input and normalized value, every intermediate of GELU's tanh
// formula -- each its own full-size output of the forward group, read again
// by a backward group. Under train.recompute selective or full (bf16's
// default), a pending elementwise value at least two ops above materialized
// data is tagged with a recompute recipe (runtime/autograd/recompute.h), as
// the fused LayerNorm and GELU tag their outputs: a SavedTensor then keeps
// the recipe, not the storage, so the forward group need not write it. In
// backward, unpacking rebuilds it from its arguments -- values its group did
// write (Computed), recorded inputs, and the sums it reads (pinned by the
// recipe, so they are written: a row statistic is small) -- as new pending
// nodes, recorded into the backward's own group: recomputed there, from data
// that group often reads anyway, instead of stored and loaded. The rebuilt
// value is bitwise the forward's: the same ops on the same bits, each
// rounded to its dtype (no contraction, no reassociation in elementwise
// code). A one-op value (a bias add) is not tagged: rebuilding it would pin
// its input, as large as itself, and cost a pass when an opaque op (a GEMM,
// attention) reads it. Versions guard the inputs: one written in place since
// the forward makes the unpack fail, as a saved tensor's would.
/// Tags `t` (pending node `n`) with its recipe when Note [Saved values recomputed] says so.
void maybe_recomputable(const Tensor& t, const std::shared_ptr<LazyNode>& n) {
  if (n->op == Op::Sum || n->depth < 2 || !GradMode::enabled() ||
      autograd::recompute_mode() == Recompute::None)
    return;
  std::vector<std::shared_ptr<Storage>> pins;
  for (const auto& r : n->sums) pins.push_back(storage_of(r));
  autograd::make_recomputable(t, [n, pins = std::move(pins)] { return rebuild(n, true); });
}

/// A pending tensor of `n`'s shape and dtype, registered in the context.
Tensor make_pending(const std::shared_ptr<LazyNode>& n) {
  Tensor t = tensor_over(storage_of(n), n->shape, n->dtype, n->stream);
  size_t count;
  {
    std::lock_guard<std::mutex> lk(ctx().mu);
    ctx().pending.push_back(n);
    count = ctx().pending.size();
  }
  maybe_recomputable(t, n);
  if (count >= kMaxPending) flush();  // t is held here: it is computed as an output
  return t;
}

/// The node behind `t` when t is exactly a pending value (not a view of one).
std::shared_ptr<LazyNode> pending_node(const Tensor& t) {
  const std::shared_ptr<PendingValue>& p = t.impl()->storage->pending;
  if (!p) return nullptr;
  auto n = std::static_pointer_cast<LazyNode>(p);
  if (t.offset() == 0 && t.shape() == n->shape && t.dtype() == n->dtype && t.is_contiguous()) return n;
  return nullptr;
}

/// Adds the arguments `ts` to `n`: each one's pending node, or the tensor
/// itself, counted as a reader of its storage. A view of pending data (not
/// the pending value itself) is computed first -- for every argument before
/// any is linked, since that flush computes every pending node, and a node
/// linked before it would point at a node no later flush holds.
void add_args(LazyNode& n, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->impl()->storage->pending && !pending_node(*t)) (void)t->data_ptr();
  for (const Tensor* t : ts) {
    if (std::shared_ptr<LazyNode> p = pending_node(*t)) {
      if (p->op == Op::Sum) {
        n.sums.push_back(p);
      } else {
        n.depth = std::max(n.depth, p->depth + 1);
        n.sums.insert(n.sums.end(), p->sums.begin(), p->sums.end());
      }
      n.args.push_back(std::move(p));
      n.inputs.emplace_back();
      n.input_versions.push_back(0);
    } else {
      t->impl()->storage->lazy_readers.fetch_add(1);
      n.args.push_back(nullptr);
      n.inputs.push_back(*t);
      n.input_versions.push_back(t->version());
    }
  }
  n.computed.resize(n.args.size());
  std::sort(n.sums.begin(), n.sums.end());
  n.sums.erase(std::unique(n.sums.begin(), n.sums.end()), n.sums.end());
}

std::shared_ptr<LazyNode> new_node(Op op, DType dtype, Shape shape, const Tensor& like) {
  auto n = std::make_shared<LazyNode>();
  n->op = op;
  n->dtype = dtype;
  n->shape = std::move(shape);
  n->device = like.device();
  n->stream = Stream::current(like.device());
  return n;
}

void flush_hook() { flush(); }

/// Registers flush() as the storages' flush, once.
void install_hook() {
  static std::once_flag once;
  std::call_once(once, [] { g_pending_flush.store(&flush_hook); });
}

std::string hex_name(const std::string& text) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "group_%016zx", std::hash<std::string>{}(text));
  return buf;
}

/// Builds, compiles (or finds) and runs the group of the live nodes in `work`
/// (all on one device), then gives each output storage its memory and values.
void run_group(const std::vector<std::shared_ptr<LazyNode>>& work) {
  const size_t n = work.size();
  std::unordered_map<const LazyNode*, size_t> index;
  for (size_t i = 0; i < n; ++i) index[work[i].get()] = i;
  // Liveness, from the outputs back (work is in creation order, a topological order).
  std::vector<std::shared_ptr<Storage>> out_storage(n);
  std::vector<char> needed(n, 0);
  for (size_t i = n; i-- > 0;) {
    out_storage[i] = work[i]->storage.lock();
    if (out_storage[i]) needed[i] = 1;
    if (!needed[i]) continue;
    for (const auto& a : work[i]->args)
      if (a) needed[index.at(a.get())] = 1;
  }
  Group g;
  std::vector<int> node_of(n, -1);
  std::vector<Tensor> inputs;
  // Inputs by what they read, and computed nodes by what they compute: the
  // same value recorded twice -- the recipes of Note [Saved values recomputed]
  // rebuild shared intermediates once per saved value, each over its own
  // handle of the same storage -- is read and computed once.
  std::map<std::tuple<const Storage*, int64_t, Shape, std::vector<int64_t>, DType>, int> input_of;
  std::unordered_map<std::string, int> computed_as;
  std::vector<char> is_output;
  const auto key_of = [&](int id) {
    const Node& nd = g.nodes[static_cast<size_t>(id)];
    std::string k = cat(op_name(nd.op), " ", dtype_name(nd.dtype), " ", shape_str(nd.shape), " ", nd.keepdim);
    for (int64_t d : nd.dims) k += cat(" d", d);
    for (int a : nd.args) {
      const Node& an = g.nodes[static_cast<size_t>(a)];
      char v[40];
      std::snprintf(v, sizeof v, " s%a", an.value);
      k += an.op == Op::Scalar ? cat(v, dtype_name(an.dtype)) : cat(" %", a);
    }
    return k;
  };
  std::vector<int> outputs_idx;
  int64_t fused = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!needed[i]) continue;
    const LazyNode& x = *work[i];
    std::vector<int> a;
    for (size_t k = 0; k < x.args.size(); ++k) {
      if (x.args[k]) {
        a.push_back(node_of[index.at(x.args[k].get())]);
        continue;
      }
      const Tensor& t = x.inputs[k];
      const auto key =
          std::make_tuple(t.impl()->storage.get(), t.offset(), t.shape(), t.strides(), t.dtype());
      auto it = input_of.find(key);
      if (it == input_of.end()) {
        it = input_of.emplace(key, g.input(t.dtype(), t.shape(), input_layout(t))).first;
        inputs.push_back(t);
      }
      a.push_back(it->second);
    }
    const size_t before = g.nodes.size();
    int id;
    if (x.scalar_arg) {
      id = g.binary(x.op, a[0], g.scalar(x.value, x.scalar_dtype), x.shape);
    } else if (x.op == Op::Cast) {
      id = g.cast(a[0], x.dtype);
    } else if (x.op == Op::Sum) {
      int src = a[0];
      if (g.nodes[src].dtype != x.dtype)
        src = g.cast(src, x.dtype);  // a bf16 sum in f32: exact widening first
      id = g.reduce(Op::Sum, src, {x.dim}, true);
    } else if (is_unary(x.op)) {
      id = g.unary(x.op, a[0]);
    } else {
      id = g.binary(x.op, a[0], a[1]);
    }
    is_output.resize(g.nodes.size(), 0);
    const std::string key = key_of(id);
    if (auto seen = computed_as.find(key);
        seen != computed_as.end() && !(out_storage[i] && is_output[static_cast<size_t>(seen->second)])) {
      g.nodes.resize(before);  // computed already (an output is written once: a second output keeps its node)
      id = seen->second;
    } else {
      computed_as.emplace(key, id);
    }
    node_of[i] = id;
    ++fused;
    if (out_storage[i]) {
      g.output(id);
      is_output[static_cast<size_t>(id)] = 1;
      outputs_idx.push_back(static_cast<int>(i));
    }
  }
  if (outputs_idx.empty()) return;
  const Device dev = work[outputs_idx[0]]->device;
  const std::string text = g.canonical();
  g.name = hex_name(text);
  // The outputs' memory, in their storages (every view of them sees it).
  std::vector<Tensor> outs;
  for (int i : outputs_idx) {
    const LazyNode& x = *work[i];
    Storage& st = *out_storage[i];
    st.allocator = &allocator_for(dev);
    st.data = st.nbytes ? st.allocator->allocate(st.nbytes, x.stream) : nullptr;
    outs.push_back(tensor_over(out_storage[i], x.shape, x.dtype, x.stream));
  }
  // The kernel: from the cache, or compiled now (null when compiling failed).
  Context& c = ctx();
  const std::string key = dev.str() + "\n" + text;
  std::shared_ptr<Kernel> kernel;
  bool fresh = false, known;
  {
    std::lock_guard<std::mutex> lk(c.mu);
    auto it = c.kernels.find(key);
    known = it != c.kernels.end();
    if (known) kernel = it->second;
  }
  if (!known) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      kernel = backend()->compile(g, dev);
      fresh = true;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "warning: fusion group '%s' (%zu nodes) did not compile; it runs eagerly: %s\n",
                   g.name.c_str(), g.nodes.size(), e.what());
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> lk(c.mu);
    c.kernels[key] = kernel;
    c.stats.compile_s += s;
    if (fresh) ++c.stats.kernels_compiled;
    if (fresh && kernel->loaded_from_cache()) ++c.stats.kernels_loaded;
  }
  // However this ends, the outputs are no longer pending (on an error their values are not defined,
  // and the error reaches whoever read them).
  struct Done {
    const std::vector<int>& idx;
    std::vector<std::shared_ptr<Storage>>& st;
    ~Done() {
      for (int i : idx) st[i]->pending.reset();
    }
  } done{outputs_idx, out_storage};
  // Computing a pending value is not a write autograd must see (Note [Version
  // counter]): the eager fallback's copy_ bumps the counters; put them back.
  std::vector<uint64_t> versions;
  for (int i : outputs_idx) versions.push_back(out_storage[i]->version.load());
  bool eager = kernel == nullptr;
  if (kernel) {
    // BT_PROFILE: each group by kind and the megabytes it reads and writes.
    std::string name = "fused";
    if (profiling_enabled()) {
      size_t bytes = 0;
      for (const Tensor& t : inputs) bytes += t.nbytes();
      for (const Tensor& t : outs) bytes += t.nbytes();
      name = cat("fused ", kernel->describe(), " ", (bytes + (1 << 19)) >> 20, " MB");
    }
    ProfileScope prof(name);
    kernel->run(inputs, outs);
  }
  if (eager || (fresh && c.opts.check)) {
    const std::vector<Tensor> ref = run_eager(g, inputs);
    for (size_t k = 0; k < outs.size(); ++k) {
      if (eager) {
        outs[k].copy_(ref[k]);
      } else {
        const double d = relative_difference(outs[k], ref[k]);
        std::lock_guard<std::mutex> lk(c.mu);
        c.stats.check_max_rel_diff = std::max(c.stats.check_max_rel_diff, d);
      }
    }
  }
  for (size_t k = 0; k < outputs_idx.size(); ++k) out_storage[outputs_idx[k]]->version.store(versions[k]);
  // Note [Saved values recomputed]: a recipe reads what its group wrote, and
  // drops the nodes behind it (and their inputs).
  for (const auto& y : work)
    for (size_t k = 0; k < y->args.size(); ++k)
      if (y->args[k]) {
        const size_t j = index.at(y->args[k].get());
        if (!out_storage[j]) continue;
        y->computed[k] = {out_storage[j], out_storage[j]->version.load(), work[j]->shape, work[j]->dtype};
        y->args[k].reset();
      }
  std::lock_guard<std::mutex> lk(c.mu);
  ++c.stats.groups_run;
  c.stats.nodes_fused += fused;
  c.stats.outputs_written += static_cast<int64_t>(outs.size());
  if (eager) ++c.stats.eager_fallbacks;
}

}  // namespace

LazyScope::LazyScope(const LazyOptions& opts) {
  install_hook();
  std::lock_guard<std::mutex> lk(ctx().mu);
  prev_ = ctx().opts;
  ctx().opts = opts;
  ++ctx().scopes;
}

LazyScope::~LazyScope() {
  try {
    flush();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: computing pending values at the end of a lazy-fusion scope failed: %s\n",
                 e.what());
  }
  std::lock_guard<std::mutex> lk(ctx().mu);
  --ctx().scopes;
  ctx().opts = prev_;
}

bool lazy_recording(const Device& device) {
  if (t_flushing > 0 || ctx().scopes.load(std::memory_order_relaxed) == 0) return false;
  return backend()->unavailable(device).empty();
}

Tensor lazy_unary(Op op, const Tensor& a) {
  auto n = new_node(op, a.dtype(), a.shape(), a);
  add_args(*n, {&a});
  return make_pending(n);
}

Tensor lazy_binary(Op op, const Tensor& a, const Tensor& b) {
  auto n = new_node(op, a.dtype(), broadcast_shapes(a.shape(), b.shape(), op_name(op)), a);
  add_args(*n, {&a, &b});
  return make_pending(n);
}

Tensor lazy_scalar(Op op, const Tensor& a, double s) { return lazy_scalar_to(op, a, s, a.shape()); }

Tensor lazy_scalar_to(Op op, const Tensor& a, double s, const Shape& shape) {
  auto n = new_node(op, a.dtype(), shape, a);
  add_args(*n, {&a});
  n->scalar_arg = true;
  n->value = s;
  n->scalar_dtype = compute_type(a.dtype());
  return make_pending(n);
}

Tensor lazy_cast(const Tensor& a, DType dtype) {
  auto n = new_node(Op::Cast, dtype, a.shape(), a);
  add_args(*n, {&a});
  return make_pending(n);
}

Tensor lazy_sum(const Tensor& a, int dim, DType out) {
  Shape s = a.shape();
  s[dim] = 1;
  auto n = new_node(Op::Sum, out, s, a);
  n->dim = dim;
  add_args(*n, {&a});
  return make_pending(n);
}

namespace {

/// Note [Saved values recomputed]: `n` again as a pending value (its own
/// storage is never read for the root, which a recipe exists to not keep).
Tensor rebuild(const std::shared_ptr<LazyNode>& n, bool root) {
  if (!root)
    if (std::shared_ptr<Storage> st = n->storage.lock(); st && st->pending)
      return tensor_over(st, n->shape, n->dtype, n->stream);  // still pending in this window
  std::vector<Tensor> a(n->args.size());
  for (size_t k = 0; k < a.size(); ++k) {
    if (const LazyNode::Computed& c = n->computed[k]; c.storage) {
      BT_CHECK(
          c.storage->version.load() == c.version,
          "a value saved for backward (kept as a recompute recipe, Note [Saved values recomputed]) reads a "
          "tensor that was modified in place after the forward computed it; use an out-of-place op");
      a[k] = tensor_over(c.storage, c.shape, c.dtype, n->stream);
    } else if (n->args[k]) {
      a[k] = rebuild(n->args[k], false);
    } else {
      BT_CHECK(
          n->inputs[k].version() == n->input_versions[k],
          "a value saved for backward (kept as a recompute recipe, Note [Saved values recomputed]) reads a "
          "tensor that was modified in place after it was saved (version ",
          n->input_versions[k], " then, ", n->inputs[k].version(), " now); use an out-of-place op");
      a[k] = n->inputs[k];
    }
  }
  auto m = new_node(n->op, n->dtype, n->shape, a[0]);
  m->scalar_arg = n->scalar_arg;
  m->value = n->value;
  m->scalar_dtype = n->scalar_dtype;
  m->dim = n->dim;
  if (a.size() == 1)
    add_args(*m, {&a[0]});
  else
    add_args(*m, {&a[0], &a[1]});
  Tensor t = make_pending(m);
  if (ctx().scopes.load() == 0) (void)t.data_ptr();  // no scope will flush it: compute it now
  return t;
}

}  // namespace

void flush() {
  std::vector<std::shared_ptr<LazyNode>> work;
  {
    std::lock_guard<std::mutex> lk(ctx().mu);
    work.swap(ctx().pending);
  }
  if (work.empty()) return;
  ++t_flushing;
  NoGradGuard no_grad;
  // The readers' counts go back down however the groups end.
  struct Release {
    std::vector<std::shared_ptr<LazyNode>>& w;
    ~Release() {
      for (const auto& n : w)
        for (const Tensor& t : n->inputs)
          if (t.defined()) t.impl()->storage->lazy_readers.fetch_sub(1);
      --t_flushing;
    }
  } release{work};
  struct Forget {  // what only recording needed (Note [Saved values recomputed])
    std::vector<std::shared_ptr<LazyNode>>& w;
    ~Forget() {
      for (const auto& n : w) n->sums.clear();
    }
  } forget{work};
  // One group per device, in creation order within each.
  std::map<std::string, std::vector<std::shared_ptr<LazyNode>>> by_device;
  for (const auto& n : work) by_device[n->device.str()].push_back(n);
  for (const auto& [dev, nodes] : by_device) run_group(nodes);
}

LazyStats lazy_stats() {
  std::lock_guard<std::mutex> lk(ctx().mu);
  return ctx().stats;
}

void reset_lazy_stats() {
  std::lock_guard<std::mutex> lk(ctx().mu);
  ctx().stats = LazyStats{};
}

void clear_kernel_cache() {
  std::lock_guard<std::mutex> lk(ctx().mu);
  ctx().kernels.clear();
}

}  // namespace bt::fusion
