// The clipping factor from a global sum of squares (kernels/sum_squares.h),
// in the same doubles as the CUDA kernel and runtime/optim/clip.h.
#include "kernels/sum_squares.h"

#include <cmath>
#include <limits>

#include "kernels/common/error.h"

namespace bt::kernels::cpu {

void clip_scale(const void* sumsq, DType dt, double max_norm, float* out, const double* loss) {
  BT_CHECK(dt == DType::F32 || dt == DType::F64, "clip_scale: the sum of squares must be f32 or f64, got ",
           dt);
  const double sq = dt == DType::F64 ? *static_cast<const double*>(sumsq)
                                     : static_cast<double>(*static_cast<const float*>(sumsq));
  const double norm = std::sqrt(sq);
  const double c = max_norm / (norm + 1e-6);
  out[0] = static_cast<float>(norm);
  const bool usable = std::isfinite(norm) && (loss == nullptr || std::isfinite(*loss));
  out[1] = !usable ? std::numeric_limits<float>::quiet_NaN()
                   : static_cast<float>(max_norm <= 0 || c >= 1.0 ? 1.0 : c);
}

}  // namespace bt::kernels::cpu
