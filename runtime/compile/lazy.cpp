#include "runtime/compile/lazy.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>

#include "runtime/autograd/grad_mode.h"
#include "runtime/compile/fusion_backend.h"

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

/// A pending tensor of `n`'s shape and dtype, registered in the context.
Tensor make_pending(const std::shared_ptr<LazyNode>& n) {
  auto st = std::make_shared<Storage>();
  st->device = n->device;
  st->nbytes = static_cast<size_t>(shape_numel(n->shape)) * dtype_size(n->dtype);
  st->pending = n;
  n->storage = st;
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(st);
  impl->shape = n->shape;
  impl->strides = contiguous_strides(n->shape);
  impl->dtype = n->dtype;
  impl->stream = n->stream;
  size_t count;
  {
    std::lock_guard<std::mutex> lk(ctx().mu);
    ctx().pending.push_back(n);
    count = ctx().pending.size();
  }
  Tensor t(std::move(impl));
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
      n.args.push_back(std::move(p));
      n.inputs.emplace_back();
    } else {
      t->impl()->storage->lazy_readers.fetch_add(1);
      n.args.push_back(nullptr);
      n.inputs.push_back(*t);
    }
  }
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
  std::map<const TensorImpl*, int> input_of;
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
      auto it = input_of.find(t.impl());
      if (it == input_of.end()) {
        it = input_of.emplace(t.impl(), g.input(t.dtype(), t.shape())).first;
        inputs.push_back(t);
      }
      a.push_back(it->second);
    }
    int id;
    if (x.scalar_arg) {
      id = g.binary(x.op, a[0], g.scalar(x.value, x.scalar_dtype));
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
    node_of[i] = id;
    ++fused;
    if (out_storage[i]) {
      g.output(id);
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
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = out_storage[i];
    impl->shape = x.shape;
    impl->strides = contiguous_strides(x.shape);
    impl->dtype = x.dtype;
    impl->stream = x.stream;
    outs.emplace_back(std::move(impl));
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
  if (kernel) kernel->run(inputs, outs);
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

Tensor lazy_scalar(Op op, const Tensor& a, double s) {
  auto n = new_node(op, a.dtype(), a.shape(), a);
  add_args(*n, {&a});
  n->scalar_arg = true;
  n->value = s;
  n->scalar_dtype = compute_type(a.dtype());
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
