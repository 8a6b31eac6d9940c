// Hopper's bulk tensor copies (TMA: cp.async.bulk.tensor) and the shared-memory
// barriers they complete on (mbarrier), for the warp-specialized kernels in
// kernels/cuda/sm90a/. Not a public header; the host side, which describes a
// tensor to the copy engine, is kernels/cuda/sm90a/tma_map.h.
//
// A barrier counts arrivals and, for copies, bytes: a producer thread
// announces a copy's bytes (mbar_expect_tx, which is also its arrival), the
// copy engine counts them off as they land, and the phase completes when
// every expected arrival and byte is in. Waiters name the phase by its
// parity, which flips each time the barrier completes: a consumer of round r
// of a ring slot waits for parity r & 1 on its "full" barrier, a producer
// about to fill round r waits for parity (r & 1) ^ 1 on its "empty" barrier
// (for r = 0 that is the phase before the first, which counts as complete).
#pragma once

#include <cstdint>

#include <cuda.h>  // CUtensorMap (a plain 128-byte struct: nothing of the driver is linked)

#include "kernels/cuda/mma.cuh"

namespace bt::kernels::cuda::detail {

__device__ __forceinline__ void mbar_init(uint64_t* bar, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(arrivals) : "memory");
}
/// Makes the initialized barriers visible to the copy engine; a block-wide
/// barrier must follow before any thread uses them.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/// One arrival that also expects `bytes` more from copies completing on `bar`.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
/// Waits until the phase of parity `parity` of `bar` has completed (acquire:
/// what the copies wrote is then visible to this thread and to its wgmmas).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_u32(bar);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (!done);
}

/// Copies the box of `map` at coordinates (c0, c1, c2, c3) (innermost first)
/// into shared memory at `dst`, completing `box bytes` on `bar`. Elements
/// outside the tensor arrive as zeros.
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                            int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
/// Fetches a tensor map (a __grid_constant__ kernel parameter) into the copy
/// engine's cache ahead of its first copy.
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

}  // namespace bt::kernels::cuda::detail
