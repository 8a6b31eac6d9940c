// cpu_allocator(): 64-byte aligned host memory straight from the C heap (no
// caching: glibc's malloc already caches), and allocator_for(Device).

#include <cstdlib>

#include "kernels/common/error.h"
#include "runtime/alloc/allocator.h"
#include "runtime/alloc/caching_pool.h"

namespace bt {
namespace {

constexpr size_t kCpuAlignment = 64;  // a cache line; enough for any SIMD load

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, const Stream& /*stream: CPU work is synchronous*/) override {
    BT_CHECK(nbytes <= (size_t{1} << 60), "cannot allocate ", nbytes,
             " bytes of host memory (a negative size converted to size_t?)");
    // std::aligned_alloc needs a size that is a multiple of the alignment; 0 B
    // becomes one cache line so every allocation is a distinct, valid pointer.
    const size_t size =
        nbytes == 0 ? kCpuAlignment : (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* p = std::aligned_alloc(kCpuAlignment, size);
    BT_CHECK(p != nullptr, "out of host memory: tried to allocate ", alloc_detail::format_bytes(nbytes),
             "; reduce the batch size, the data-loader prefetch depth, or the number of workers");
    return p;
  }
  void deallocate(void* ptr) override { std::free(ptr); }
};

}  // namespace

Allocator& cpu_allocator() {
  // Never destroyed: tensors freed during static destruction may still use it.
  static CpuAllocator* a = new CpuAllocator;
  return *a;
}

Allocator& allocator_for(const Device& d) {
  if (d.is_cpu()) return cpu_allocator();
  return cuda_allocator(d.index);
}

}  // namespace bt
