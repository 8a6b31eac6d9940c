// Causal scaled-dot-product self-attention, forward and backward, in the
// memory-efficient form: the [T, T] probability matrix is never stored. The
// forward saves the row log-sum-exp (lse) and the backward recomputes P.
//
//   S = scale * Q K^T (masked: key j > query i is -inf),  P = softmax(S),  O = P V
//
// Q, O and their gradients are [B, H, T, D] views, K, V and theirs [B, Hkv,
// T, D] views (Hkv = H unless set: Note [Grouped-query attention]), each given
// by element strides for b, h and t (the d stride is 1), so q/k/v can be
// slices of a fused [B, T, 3, H, D] projection without a copy. lse is
// contiguous [B, H, T] float. Dtypes: F32, F64 on CPU, BF16 (float accumulation).
//
// Note [Grouped-query attention]
// With Hkv < H key/value heads (Hkv divides H), the G = H / Hkv query heads
// h = G hk .. G hk + G - 1 share key/value head hk: query head h reads K/V
// head h / G in place (no repeated copies of K and V exist anywhere). Hkv = H
// is multi-head attention (GPT-2), and Hkv = 1 multi-query attention. In the
// backward, dK and dV of head hk are sums over the G query heads of its group;
// every kernel computes them deterministically and without atomics: the unit
// of work that owns a block of K/V rows loops over the group's query heads in
// the fixed order h = G hk, G hk + 1, ..., accumulating into the same
// registers (or compute-type buffers on the CPU) before the one write. With
// G = 1 that loop runs once and every kernel does exactly the arithmetic it did
// before GQA existed, so MHA results are bitwise unchanged. lse, the
// backward's Di scratch and everything per query row stay [B, H, T].
//
// Note [Attention in fp32]
// An F32 call's products (S = Q K^T, O = P V and the backward's five) are
// multiplied as `math` says, as a GEMM's are (kernels/common/gemm_math.h):
// Strict in fp32 FMAs (the register-tiled kernels), Tf32 as one TF32
// tensor-core product (about 1e-3 relative error, the tf32 precision's
// contract), Tf32x3 as 3xTF32 (Note [3xTF32] in kernels/gemm.h). Measured on
// an H100 (tests/kernels/cuda/attention, bt_kernel_bench), 3xTF32 attention is
// about 200x closer to float64 than TF32 but 5-20x further than strict, its
// error growing with the length summed (dK and dV over T query rows: the
// tensor cores' f32 accumulation does not round to nearest), and it is no
// faster than the strict kernels (three products per product), so the
// precision policy (attention_math) gives it to no precision by default.
// The softmax, the exponentials and every sum are fp32 whatever the math.
// The CPU computes every F32 call strictly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>

#include "kernels/common/dtype.h"
#include "kernels/common/gemm_math.h"
#ifdef BT_CUDA
#include <cuda_runtime.h>
#endif

namespace bt::kernels {

struct AttnShape {
  int64_t B = 0, H = 0, T = 0, D = 0;
  int64_t Hkv = 0;  // key/value heads; 0 means H (Note [Grouped-query attention])

  /// Key/value heads (Hkv, or H when Hkv is 0).
  int64_t kv_heads() const { return Hkv != 0 ? Hkv : H; }
  /// Query heads per key/value head, G = H / Hkv (1 when there are no heads).
  int64_t group() const { return kv_heads() > 0 ? H / kv_heads() : 1; }
};
struct AttnStrides {
  int64_t b = 0, h = 0, t = 0;
};
/// Strides of a contiguous [B, H, T, D] buffer (q, o and their gradients).
inline AttnStrides contiguous_bhtd(const AttnShape& s) { return {s.H * s.T * s.D, s.T * s.D, s.D}; }
/// Strides of a contiguous [B, Hkv, T, D] buffer (k, v and their gradients).
inline AttnStrides contiguous_kv_bhtd(const AttnShape& s) {
  return {s.kv_heads() * s.T * s.D, s.T * s.D, s.D};
}

/// Throws a clear error (naming `what`, the calling kernel) unless every dim
/// is >= 0 and the key/value heads are valid: Hkv >= 1 dividing H, or 0 (= H).
/// Host code, every build (kernels/common/attention_path.cpp).
void check_attn_shape(const AttnShape& s, const char* what);

struct AttnForward {
  DType dt = DType::F32;
  GemmMath math = GemmMath::Strict;  // F32 on CUDA: how QK^T and PV multiply (Note [Attention in fp32])
  AttnShape shape;
  float scale = 1.0f;
  const void* q = nullptr;
  AttnStrides sq;
  const void* k = nullptr;  // [B, Hkv, T, D], like v
  AttnStrides sk;
  const void* v = nullptr;
  AttnStrides sv;
  void* o = nullptr;
  AttnStrides so;
  float* lse = nullptr;  // [B, H, T]
};

struct AttnBackward {
  DType dt = DType::F32;
  GemmMath math = GemmMath::Strict;  // F32 on CUDA, as in AttnForward
  AttnShape shape;
  float scale = 1.0f;
  const void* q = nullptr;
  AttnStrides sq;
  const void* k = nullptr;
  AttnStrides sk;
  const void* v = nullptr;
  AttnStrides sv;
  const void* o = nullptr;
  AttnStrides so;
  const void* dout = nullptr;
  AttnStrides sdo;
  const float* lse = nullptr;
  void* dq = nullptr;
  AttnStrides sdq;     // written, not accumulated
  void* dk = nullptr;  // [B, Hkv, T, D], like dv: sums over each head's group
  AttnStrides sdk;
  void* dv = nullptr;
  AttnStrides sdv;
};

/// The CUDA implementations of attention (kernels/cuda/attention/attention.cu dispatches):
enum class AttnPath {
  TensorCore,  // mma.sync (kernels/cuda/attention/attention_mma.cu): BF16, and F32 as TF32 or 3xTF32
  F32Tiled,    // F32, register-tiled strict fp32 (kernels/cuda/attention/attention_f32.cu)
  Simt,        // the one-row-per-lane SIMT kernels: every call the other two do not take
};
/// "tensor-core", "f32-tiled" or "simt".
const char* name_of(AttnPath p);
inline std::ostream& operator<<(std::ostream& os, AttnPath p) { return os << name_of(p); }

namespace cuda {
/// The implementation cuda::attention_forward / attention_backward runs for `a`
/// (they switch on these). Host code on the call's description only -- dtype,
/// D, scale, pointers and strides -- compiled in every build, CUDA or not
/// (kernels/common/attention_path.cpp), so the choice is tested without a GPU.
AttnPath attention_forward_path(const AttnForward& a);
AttnPath attention_backward_path(const AttnBackward& a);
}  // namespace cuda

namespace cpu {
void attention_forward(const AttnForward& a);
void attention_backward(const AttnBackward& a);
}  // namespace cpu
#ifdef BT_CUDA
namespace cuda {
void attention_forward(const AttnForward& a, cudaStream_t stream);
/// Floats of scratch that attention_backward needs at least: Di, [B, H, T].
size_t attention_backward_scratch_floats(const AttnShape& s);
/// Floats of scratch with which attention_backward(a) runs fastest: more than
/// the least for the strict-fp32 tiled path, whose dK/dV pass hands its dS
/// tiles to the dQ pass through it (at most 256 MiB more; Note [dS through
/// memory in fp32] in kernels/cuda/attention/attention_f32.cu).
size_t attention_backward_scratch_floats(const AttnBackward& a);
/// `scratch` holds `scratch_floats` floats, 0 meaning the least
/// (attention_backward_scratch_floats(a.shape)); the fp32 tiled path uses what
/// is there beyond it.
void attention_backward(const AttnBackward& a, float* scratch, cudaStream_t stream,
                        size_t scratch_floats = 0);

/// The Hopper kernels (kernels/cuda/sm90a/attention_wgmma*.cu, wgmma): a BF16
/// forward or backward with D = 64 on the tensor-core path runs them when
/// this build has the sm_90a kernels, the current device is compute
/// capability 9.0, and they are turned on (the default; BT_ATTENTION_WGMMA=0
/// in the environment at start, or set_attention_wgmma(false), turns both
/// off); else the mma.sync kernels. The forward also asks a positive stride
/// for every dimension of q, k and v that has more than one entry, and
/// T < 2^30 (its tiles come through the copy engine). Same results within
/// bf16 rounding, not the same bits.
bool attention_wgmma_available();
bool attention_forward_uses_wgmma(const AttnForward& a);
bool attention_backward_uses_wgmma(const AttnBackward& a);
bool attention_wgmma_enabled();  // the switch alone
void set_attention_wgmma(bool on);
}  // namespace cuda
#endif
}  // namespace bt::kernels
