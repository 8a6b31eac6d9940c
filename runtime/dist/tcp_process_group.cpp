#include "runtime/dist/tcp_process_group.h"

#include <algorithm>
#include <functional>

#include "runtime/dist/tcp_star.h"

namespace bt::dist {

// Note [TCP process group]
//
// A job started with torchrun-style variables has no MPI, so its CPU tensors
// travel over plain TCP (runtime/dist/tcp_star.h):
//   - wiring: rank 0 listens on a free port of every interface and posts
//     MASTER_ADDR:port in the rendezvous store (Note [Rendezvous] in
//     world.cpp); every other rank opens two connections to it: data, and
//     ctrl, which only ever carries rank 0's error message. The ranks talk to
//     rank 0 only: a star.
//   - a collective: each rank sends rank 0 a header (kind, number, dtype,
//     size), so rank 0 knows who has arrived and refuses collectives that
//     differ across ranks, then its bytes. Rank 0 adds them chunk by chunk
//     (1 MiB), always in rank order ((x0 + x1) + x2) + ..., and sends each
//     result chunk back as soon as it exists; all_gather and broadcast are
//     forwarded the same way, and a barrier is headers one way and a word
//     back. Every rank thus ends with rank 0's bytes: results are bitwise
//     identical across ranks and from run to run. Avg divides the sum
//     afterwards on each rank (Tensor::mul_), as the MPI group does, so with
//     two ranks (where a + b is the only order) the results equal MPI's bit
//     for bit; with more, MPI may add in another order and differ in the
//     last bits (Open MPI 4.1 does with four ranks).
//   - cost: rank 0 moves (N - 1) times every rank's bytes, each way: O(N) at
//     rank 0, against O(1) per rank for a ring. Right for CPU jobs (a CPU's
//     step is long next to its gradient traffic) and for the small groups
//     Kubernetes jobs of CPU pods make; GPU tensors go through NCCL.
//   - threads: collectives run in issue order on one worker thread per group,
//     moving bytes with nonblocking sockets (TCP_NODELAY) and poll(). The
//     caller's thread checks arguments, numbers the collective and waits with
//     the group's deadline: CollectiveTimeout names the collective, its
//     number, the step and, as far as this rank knows, who had not arrived
//     (rank 0 knows every rank; the others know rank 0). The worker touches
//     only raw byte ranges; tensors are held and released on the caller's
//     thread (the graveyard), and Avg's division runs there too.
//   - failures: a connection that closes or resets while a collective still
//     needs it ends that collective at once with "rank R disappeared during
//     all_reduce #k ...". Rank 0 then sends its message to every other rank
//     over ctrl, so all fail with it rather than wait. A failed group stays
//     failed: later collectives throw the same error. A rank that exits
//     (abort_world, a crash, a kill) closes its sockets, which is how the
//     others notice it.

struct TcpOp {
  StarCollective c;
  std::vector<Tensor> keep;     // what the worker reads and writes, held until the caller waits
  std::function<void()> after;  // on the caller's thread once done (Avg's division)
  enum class State { Queued, Done, Failed } state = State::Queued;  // the group's mu_
  std::string error;
};

class TcpWork : public Work {
 public:
  TcpWork(TcpProcessGroup* pg, std::shared_ptr<TcpOp> op) : pg_(pg), op_(std::move(op)) {}
  void wait() override {
    pg_->await(*op_);
    finish();
  }
  bool done() override {
    if (!pg_->finished(*op_)) return false;
    finish();
    return true;
  }

 private:
  void finish() {
    if (finished_) return;
    finished_ = true;
    if (op_->after) op_->after();
    op_->after = nullptr;
    op_->keep.clear();
  }

  TcpProcessGroup* pg_;
  std::shared_ptr<TcpOp> op_;
  bool finished_ = false;
};

TcpProcessGroup::TcpProcessGroup(TcpStore& store, int rank, int size)
    : ProcessGroup(rank, size), reached_(static_cast<size_t>(size), rank == 0 ? 0 : -1) {
  BT_CHECK(size >= 1 && rank >= 0 && rank < size, "tcp process group: rank ", rank,
           " is not in a world of size ", size);
  reached_[0] = reached_[static_cast<size_t>(rank)] = 0;
  star_ = std::make_unique<TcpStar>(store, rank, size, [this](int r, int64_t seq) {
    std::lock_guard<std::mutex> lk(mu_);
    reached_[static_cast<size_t>(r)] = seq;
  });
  worker_ = std::thread([this] { work_loop(); });
}

TcpProcessGroup::~TcpProcessGroup() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  star_->stop();
  worker_.join();
}

void TcpProcessGroup::work_loop() {
  for (;;) {
    std::shared_ptr<TcpOp> op;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) {
        fail_queued("the process group was destroyed");
        return;
      }
      op = std::move(queue_.front());
      queue_.pop_front();
      reached_[static_cast<size_t>(rank_)] = op->c.seq;
    }
    std::string error;
    try {
      star_->run(op->c);
    } catch (const TcpStar::Stopped&) {
      error = cat(op->c.what, " was abandoned: the process group was destroyed while it ran");
    } catch (const std::exception& e) {
      error = e.what();
      if (rank_ == 0) star_->tell_peers(error);
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      op->state = error.empty() ? TcpOp::State::Done : TcpOp::State::Failed;
      op->error = error;
      graveyard_.push_back(std::move(op));
      if (!error.empty()) fail_queued(error);
    }
    cv_.notify_all();
    if (!error.empty()) return;  // a failed group stays failed
  }
}

void TcpProcessGroup::fail_queued(const std::string& why) {
  if (broken_.empty()) broken_ = why;
  for (std::shared_ptr<TcpOp>& q : queue_) {
    q->state = TcpOp::State::Failed;
    q->error = cat(q->c.what, " cannot run: ", broken_);
    graveyard_.push_back(std::move(q));
  }
  queue_.clear();
}

std::shared_ptr<Work> TcpProcessGroup::issue(std::shared_ptr<TcpOp> op, const char* name) {
  op->c.seq = ++seq_;
  op->c.what = describe(name, op->c.seq);
  std::vector<std::shared_ptr<TcpOp>> done;  // freed here, outside the lock
  {
    std::lock_guard<std::mutex> lk(mu_);
    done.swap(graveyard_);
    if (broken_.empty()) {
      queue_.push_back(op);
    } else {
      op->state = TcpOp::State::Failed;
      op->error = cat(op->c.what, " cannot run: ", broken_);
    }
  }
  cv_.notify_all();
  return std::make_shared<TcpWork>(this, std::move(op));
}

void TcpProcessGroup::await(TcpOp& op) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_for(lk, timeout(), [&op] { return op.state != TcpOp::State::Queued; }))
    throw CollectiveTimeout(timeout_message(op));
  if (op.state == TcpOp::State::Failed) throw Error(op.error);
}

bool TcpProcessGroup::finished(TcpOp& op) {
  std::lock_guard<std::mutex> lk(mu_);
  if (op.state == TcpOp::State::Failed) throw Error(op.error);
  return op.state == TcpOp::State::Done;
}

std::string TcpProcessGroup::timeout_message(const TcpOp& op) const {
  // The worker runs collectives in order: if it is still in an earlier one,
  // that one is what waits.
  const int64_t running = reached_[static_cast<size_t>(rank_)];
  const int64_t seq = std::min(running, op.c.seq);
  std::string arrivals = not_arrived(reached_, seq);
  if (rank_ != 0 && reached_[0] >= seq)
    arrivals =
        "rank 0 has arrived and waits for the others (this rank talks only to rank 0, whose error "
        "names the ranks that did not arrive)";
  if (seq < op.c.seq)
    arrivals = cat("this rank is still in collective #", seq, ", issued before it; ", arrivals);
  return timeout_text(op.c.what, arrivals);
}

namespace {

/// A collective over byte ranges of `in` and `out` (undefined: none), held until waited on.
std::shared_ptr<TcpOp> make_op(StarCollective::Kind kind, const Tensor& in, const Tensor& out, size_t n) {
  auto o = std::make_shared<TcpOp>();
  o->c.kind = kind;
  o->c.dtype = in.dtype();
  o->c.in = static_cast<char*>(in.data_ptr());
  o->c.out = out.defined() ? static_cast<char*>(out.data_ptr()) : nullptr;
  o->c.n = n;
  o->keep = {in};
  if (out.defined()) o->keep.push_back(out);
  return o;
}

/// Avg: the sum divided by the ranks, as the MPI group does it.
std::function<void()> divide(ReduceOp op, const Tensor& t, int size) {
  if (op != ReduceOp::Avg || size == 1) return {};
  return [t, size] { Tensor(t).mul_(1.0 / size); };
}

}  // namespace

std::shared_ptr<Work> TcpProcessGroup::all_reduce_async(const Tensor& t, ReduceOp op) {
  check_tensor("all_reduce", t, false);
  check_reducible("all_reduce", t.dtype(), op);
  auto o = make_op(StarCollective::kAllReduce, t, Tensor(), t.nbytes());
  o->after = divide(op, t, size_);
  return issue(std::move(o), "all_reduce");
}

std::shared_ptr<Work> TcpProcessGroup::reduce_scatter_async(const Tensor& in, const Tensor& out,
                                                            ReduceOp op) {
  check_pair("reduce_scatter", out, in, false);
  check_reducible("reduce_scatter", in.dtype(), op);
  auto o = make_op(StarCollective::kReduceScatter, in, out, out.nbytes());
  o->after = divide(op, out, size_);
  return issue(std::move(o), "reduce_scatter");
}

std::shared_ptr<Work> TcpProcessGroup::all_gather_async(const Tensor& in, const Tensor& out) {
  check_pair("all_gather", in, out, false);
  return issue(make_op(StarCollective::kAllGather, in, out, in.nbytes()), "all_gather");
}

std::shared_ptr<Work> TcpProcessGroup::broadcast_async(const Tensor& t, int root) {
  check_tensor("broadcast", t, false);
  BT_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of this group of ", size_);
  auto o = make_op(StarCollective::kBroadcast, t, Tensor(), t.nbytes());
  o->c.root = root;
  return issue(std::move(o), "broadcast");
}

void TcpProcessGroup::barrier() { issue(std::make_shared<TcpOp>(), "barrier")->wait(); }

}  // namespace bt::dist
