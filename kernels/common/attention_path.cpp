// Which CUDA attention implementation a call runs (kernels/attention.h), and
// the shape check every backend shares. Plain C++ on the call's description,
// so every build compiles it and its test
// (tests/kernels/common/test_attention_path.cpp) runs without a GPU;
// kernels/cuda/attention/attention.cu switches on it, so the test checks what runs.
//
// The two tiled implementations move every row of every view with 16-byte
// loads and stores (cp.async and vector stores), and are compiled for a few
// head dims; the SIMT kernels read element by element and take any D <= 128.
#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "kernels/attention.h"
#include "kernels/common/error.h"

namespace bt::kernels {
namespace {

struct View {
  const void* p;
  AttnStrides s;
  bool kv = false;  // a [B, Hkv, T, D] view (k, v, dk, dv)
};

/// Every [b, h, t] row of every view starts on a 16-byte boundary: an aligned
/// pointer and b, h, t strides that are multiples of 16 bytes (a stride of a
/// dimension of size 1 is never applied, so it does not matter).
bool rows_aligned16(std::initializer_list<View> views, const AttnShape& sh, DType dt) {
  const int64_t n = 16 / static_cast<int64_t>(dtype_size(dt));
  for (const View& v : views) {
    const int64_t heads = v.kv ? sh.kv_heads() : sh.H;
    const bool ok = v.p != nullptr && reinterpret_cast<uintptr_t>(v.p) % 16 == 0 &&
                    (sh.B == 1 || v.s.b % n == 0) && (heads == 1 || v.s.h % n == 0) &&
                    (sh.T == 1 || v.s.t % n == 0);
    if (!ok) return false;
  }
  return true;
}

/// The tensor-core kernels need scale > 0 (their online softmax takes the max
/// of the raw scores for the max of the scaled ones) and finite.
bool tensor_core_scale(float scale) { return scale > 0.0f && !std::isinf(scale); }

/// F32 with D in {32, 64} and aligned rows: the tensor cores when the math
/// allows TF32 products and the scale suits them, else the register-tiled
/// strict kernels (any finite scale). Everything else: the SIMT kernels.
template <typename Aligned>
AttnPath f32_path(DType dt, GemmMath math, int64_t D, float scale, const Aligned& aligned) {
  if (dt != DType::F32 || (D != 32 && D != 64) || !std::isfinite(scale) || !aligned()) return AttnPath::Simt;
  return math != GemmMath::Strict && tensor_core_scale(scale) ? AttnPath::TensorCore : AttnPath::F32Tiled;
}

}  // namespace

void check_attn_shape(const AttnShape& s, const char* what) {
  BT_CHECK(s.B >= 0 && s.H >= 0 && s.T >= 0 && s.D >= 0 && s.Hkv >= 0, what, ": negative shape [B=", s.B,
           ", H=", s.H, ", T=", s.T, ", D=", s.D, ", Hkv=", s.Hkv, "]");
  BT_CHECK(s.Hkv == 0 || s.H % s.Hkv == 0, what, ": the ", s.Hkv, " key/value heads (Hkv) must divide the ",
           s.H,
           " query heads (H): each key/value head serves H / Hkv query heads "
           "(Note [Grouped-query attention])");
}

const char* name_of(AttnPath p) {
  switch (p) {
    case AttnPath::TensorCore:
      return "tensor-core";
    case AttnPath::F32Tiled:
      return "f32-tiled";
    case AttnPath::Simt:
      return "simt";
  }
  return "?";
}

namespace cuda {

AttnPath attention_forward_path(const AttnForward& a) {
  const int64_t D = a.shape.D;
  const auto aligned = [&] {
    return rows_aligned16({{a.q, a.sq}, {a.k, a.sk, true}, {a.v, a.sv, true}, {a.o, a.so}}, a.shape, a.dt);
  };
  if (a.dt == DType::BF16 && (D == 32 || D == 64 || D == 128) && tensor_core_scale(a.scale) && aligned())
    return AttnPath::TensorCore;
  return f32_path(a.dt, a.math, D, a.scale, aligned);
}

AttnPath attention_backward_path(const AttnBackward& a) {
  const int64_t D = a.shape.D;
  const auto aligned = [&] {
    return rows_aligned16({{a.q, a.sq},
                           {a.k, a.sk, true},
                           {a.v, a.sv, true},
                           {a.o, a.so},
                           {a.dout, a.sdo},
                           {a.dq, a.sdq},
                           {a.dk, a.sdk, true},
                           {a.dv, a.sdv, true}},
                          a.shape, a.dt);
  };
  // The tensor-core backward has no D = 128 configuration (the forward has).
  if (a.dt == DType::BF16 && (D == 32 || D == 64) && tensor_core_scale(a.scale) && aligned())
    return AttnPath::TensorCore;
  return f32_path(a.dt, a.math, D, a.scale, aligned);
}

}  // namespace cuda
}  // namespace bt::kernels
