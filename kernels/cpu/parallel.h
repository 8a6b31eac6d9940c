// Multi-threading for the CPU kernels: one small persistent thread pool and
// parallel_for over index ranges.
//
// Policy
//  * One process-wide pool: num_threads() - 1 worker threads plus the thread
//    that calls parallel_for, which works on the loop too. num_threads() is
//    the environment variable BT_NUM_THREADS (a positive integer) when it is
//    set, else the number of CPUs the process may run on (its affinity mask,
//    so taskset, cpusets and Slurm allocations count; else
//    std::thread::hardware_concurrency()). It is read once, at the first
//    parallel loop. With 1 thread every loop runs inline on the caller.
//    set_num_threads() changes the size (tests); the workers start lazily.
//  * parallel_for(begin, end, grain, fn) splits [begin, end) into the chunks
//    [begin + c * grain, min(end, begin + (c + 1) * grain)) and calls fn(lo, hi)
//    once per chunk, on some thread of the pool, in no particular order.
//    Kernels pick `grain` as a constant of their shape (never of the thread
//    count), big enough that a chunk is worth a thread wake-up (~10-50 us).
//  * Inline: a loop of one chunk, a pool of one thread, and a nested call (from
//    inside a chunk) run on the calling thread, chunk by chunk in order.
//  * Exceptions: a chunk that throws stops the loop from starting further
//    chunks; once the running ones end, the exception of the lowest-numbered
//    chunk that threw is rethrown to the caller of parallel_for.
//  * Workers sleep on a condition variable between loops (no spinning), so an
//    idle pool costs no CPU. Loops from two outside threads take turns.
//  * OpenBLAS keeps its own threads (GEMM is not run on this pool); see
//    kernels/cpu/gemm.cpp for how the two are kept from fighting.
//
// Note [Deterministic CPU parallelism]
// The chunks of a loop are a function of (begin, end, grain) only, never of
// the number of threads or of timing. So a kernel whose chunks write disjoint
// outputs, or that reduces each chunk into its own slot (chunk c = (lo - begin)
// / grain) and then combines the slots in chunk order on one thread, gives
// bitwise-identical results for every thread count, BT_NUM_THREADS=1
// included. Kernels that rely on this cite the note. The per-element math of
// an element-wise or row-wise kernel is untouched by the split, so those
// produce the same bits as a plain serial loop.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace bt::kernels::cpu {

/// Threads a parallel loop uses (the caller included); >= 1.
int num_threads();

/// Sets the pool size: n >= 1 threads, or n <= 0 for the default
/// (BT_NUM_THREADS, else the hardware concurrency). Must not be called while a
/// parallel loop runs; meant for tests and benchmarks.
void set_num_threads(int n);

/// True on a thread that is running a chunk of a parallel loop.
bool in_parallel_region();

/// Number of chunks parallel_for makes of [begin, end) with this grain.
inline int64_t num_chunks(int64_t begin, int64_t end, int64_t grain) {
  if (end <= begin) return 0;
  grain = std::max<int64_t>(grain, 1);
  return (end - begin + grain - 1) / grain;
}

namespace detail {
/// Runs call(ctx, c) for c in [0, nchunks) on the pool (see the policy above).
void run_chunks(int64_t nchunks, void (*call)(void*, int64_t), void* ctx);
}  // namespace detail

/// Calls fn(lo, hi) for each chunk of [begin, end): chunk c is
/// [begin + c * grain, min(end, begin + (c + 1) * grain)). grain < 1 means 1.
/// Note [Deterministic CPU parallelism] says what a kernel may rely on.
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, F&& fn) {
  if (end <= begin) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t n = num_chunks(begin, end, grain);
  if (n == 1) {
    fn(begin, end);
    return;
  }
  struct Ctx {
    std::remove_reference_t<F>* fn;
    int64_t begin, end, grain;
  } ctx{&fn, begin, end, grain};
  detail::run_chunks(
      n,
      [](void* p, int64_t c) {
        const Ctx& x = *static_cast<const Ctx*>(p);
        const int64_t lo = x.begin + c * x.grain;
        (*x.fn)(lo, std::min(x.end, lo + x.grain));
      },
      &ctx);
}

/// A grain for a loop whose index costs about `work` elementary operations,
/// so that each chunk does at least `min_work` of them (a constant, so the
/// chunks depend only on the shape: Note [Deterministic CPU parallelism]).
inline int64_t grain_for(int64_t work, int64_t min_work = int64_t{1} << 15) {
  return std::max<int64_t>(1, min_work / std::max<int64_t>(work, 1));
}

}  // namespace bt::kernels::cpu
