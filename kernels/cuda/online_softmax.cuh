// The running (max, sum of exp) pair behind one-pass softmax, log-sum-exp and
// cross-entropy: per-thread accumulation and warp-wide combination.
#pragma once

#include <cmath>

namespace bt::kernels::cuda::detail {

/// sum_i exp(x_i) = s * exp(m) over the values seen so far.
struct MaxSum {
  float m, s;
};

/// Adds one value. A NaN value propagates into s.
__device__ __forceinline__ void online_add(MaxSum& st, float v) {
  if (v > st.m) {
    st.s = st.s * expf(st.m - v) + 1.0f;
    st.m = v;
  } else if (v != -INFINITY) {
    st.s += expf(v - st.m);
  }
}

/// Merges two partial states. NaN in either sum propagates (fmaxf ignores a NaN max, the sums keep it).
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return MaxSum{m, 0.0f};
  return MaxSum{m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

/// Combines across a full warp; every lane gets the result.
__device__ __forceinline__ MaxSum warp_combine(MaxSum v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum t{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
    v = combine(v, t);
  }
  return v;
}

}  // namespace bt::kernels::cuda::detail
