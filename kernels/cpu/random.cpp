// CPU Philox fills. Element i is philox::{uniform,normal}_at(seed, offset + i),
// a float, stored as is (F32), widened exactly (F64) or rounded once (BF16, F16);
// so the values match the CUDA kernels bit for bit. Element i depends only on
// (seed, offset + i), so element ranges run in parallel with the same bits.
#include "kernels/random.h"

#include "kernels/common/philox.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/parallel.h"

namespace bt::kernels::cpu {
namespace {

template <class Gen>
void fill_with(const char* kernel, DType dt, void* dst, int64_t n, uint64_t offset, Gen&& gen) {
  detail::check_count(kernel, "n", n);
  if (n > 0) BT_CHECK(dst != nullptr, kernel, ": null output for ", n, " elements");
  auto run = [&](auto* out) {
    using T = std::remove_pointer_t<decltype(out)>;
    parallel_for(0, n, int64_t{1} << 12, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const float v = gen(offset + static_cast<uint64_t>(i));  // uint64 wraps, like CUDA
        if constexpr (std::is_same_v<T, float>)
          out[i] = v;
        else if constexpr (std::is_same_v<T, double>)
          out[i] = static_cast<double>(v);
        else
          out[i] = T(v);  // bf16 / f16: round to nearest even
      }
    });
  };
  switch (dt) {
    case DType::F32:
      return run(static_cast<float*>(dst));
    case DType::F64:
      return run(static_cast<double*>(dst));
    case DType::BF16:
      return run(static_cast<bf16*>(dst));
    case DType::F16:
      return run(static_cast<f16*>(dst));
    default:
      break;
  }
  BT_FAIL(kernel, ": unsupported dtype ", dt, " (random fills support f32, f64, bf16 and f16)");
}

}  // namespace

void fill_uniform(DType dt, void* dst, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi) {
  fill_with("fill_uniform", dt, dst, n, offset,
            [&](uint64_t idx) { return philox::uniform_at(seed, idx, lo, hi); });
}

void fill_normal(DType dt, void* dst, int64_t n, uint64_t seed, uint64_t offset, float mean, float std) {
  fill_with("fill_normal", dt, dst, n, offset,
            [&](uint64_t idx) { return philox::normal_at(seed, idx, mean, std); });
}

}  // namespace bt::kernels::cpu
