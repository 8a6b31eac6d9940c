// Which CUDA attention implementation a call takes
// (cuda::attention_forward_path / attention_backward_path, host code that the
// CUDA dispatcher switches on): every condition at its boundary -- dtype, the
// f32 math, each head dim, the scale, each view's pointer and each of its
// strides. No GPU:
// the pointers point into a host array and are never read.
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "kernels/attention.h"

namespace bt::kernels {
namespace {

using cuda::attention_backward_path;
using cuda::attention_forward_path;

constexpr int kViews = 8;  // the forward has the first 4
const char* const kViewNames[kViews] = {"q", "k", "v", "o", "dout", "dq", "dk", "dv"};

alignas(16) unsigned char arena[16 * (kViews + 1)];

/// A call's description: view i points to arena + 16 i + bytes[i] (aligned
/// when bytes[i] is a multiple of 16) with strides[i] (contiguous unless set).
struct Call {
  DType dt = DType::BF16;
  GemmMath math = GemmMath::Strict;
  AttnShape shape{2, 3, 17, 64};
  float scale = 0.125f;
  int64_t bytes[kViews] = {};
  AttnStrides strides[kViews];

  Call() { set_all_strides(contiguous_bhtd(shape)); }
  Call(DType t, int64_t D) : dt(t) {
    shape.D = D;
    set_all_strides(contiguous_bhtd(shape));
  }
  void set_all_strides(const AttnStrides& s) {
    for (AttnStrides& x : strides) x = s;
  }
  const unsigned char* ptr(int i) const { return arena + 16 * i + bytes[i]; }

  AttnPath forward() const {
    AttnForward f;
    f.dt = dt, f.math = math, f.shape = shape, f.scale = scale;
    f.q = ptr(0), f.sq = strides[0];
    f.k = ptr(1), f.sk = strides[1];
    f.v = ptr(2), f.sv = strides[2];
    f.o = const_cast<unsigned char*>(ptr(3)), f.so = strides[3];
    return attention_forward_path(f);
  }
  AttnPath backward() const {
    AttnBackward b;
    b.dt = dt, b.math = math, b.shape = shape, b.scale = scale;
    b.q = ptr(0), b.sq = strides[0];
    b.k = ptr(1), b.sk = strides[1];
    b.v = ptr(2), b.sv = strides[2];
    b.o = ptr(3), b.so = strides[3];
    b.dout = ptr(4), b.sdo = strides[4];
    b.dq = const_cast<unsigned char*>(ptr(5)), b.sdq = strides[5];
    b.dk = const_cast<unsigned char*>(ptr(6)), b.sdk = strides[6];
    b.dv = const_cast<unsigned char*>(ptr(7)), b.sdv = strides[7];
    return attention_backward_path(b);
  }
};

/// The fast path of dt (the tensor cores for bf16, the tiled kernels for f32).
AttnPath fast(DType dt) { return dt == DType::BF16 ? AttnPath::TensorCore : AttnPath::F32Tiled; }

TEST(AttentionPath, NamesAreDistinct) {
  const std::set<std::string> names{name_of(AttnPath::TensorCore), name_of(AttnPath::F32Tiled),
                                    name_of(AttnPath::Simt)};
  EXPECT_EQ(names.size(), 3u);
  EXPECT_STREQ(name_of(AttnPath::TensorCore), "tensor-core");
}

TEST(AttentionPath, Bf16HeadDimsOnTheTensorCores) {
  // Forward D in {32, 64, 128}, backward D in {32, 64}: D = 128 backward falls back.
  for (int64_t D = 1; D <= 160; ++D) {
    SCOPED_TRACE(::testing::Message() << "D " << D);
    const Call c(DType::BF16, D);
    const bool fwd = D == 32 || D == 64 || D == 128, bwd = D == 32 || D == 64;
    EXPECT_EQ(c.forward(), fwd ? AttnPath::TensorCore : AttnPath::Simt);
    EXPECT_EQ(c.backward(), bwd ? AttnPath::TensorCore : AttnPath::Simt);
  }
}

TEST(AttentionPath, F32HeadDimsOnTheTiledKernels) {
  for (int64_t D = 1; D <= 160; ++D) {
    SCOPED_TRACE(::testing::Message() << "D " << D);
    const Call c(DType::F32, D);
    const AttnPath want = D == 32 || D == 64 ? AttnPath::F32Tiled : AttnPath::Simt;
    EXPECT_EQ(c.forward(), want);
    EXPECT_EQ(c.backward(), want);
  }
}

TEST(AttentionPath, F32WithTf32MathOnTheTensorCores) {
  // TF32 or 3xTF32 products (Note [Attention in fp32]): the tensor cores for
  // the head dims the tiled kernels take; BF16 (and F64, below) ignore the math.
  for (GemmMath m : {GemmMath::Tf32, GemmMath::Tf32x3})
    for (int64_t D = 1; D <= 160; ++D) {
      SCOPED_TRACE(::testing::Message() << "math " << static_cast<int>(m) << " D " << D);
      Call c(DType::F32, D), bf(DType::BF16, D);
      c.math = bf.math = m;
      const AttnPath want = D == 32 || D == 64 ? AttnPath::TensorCore : AttnPath::Simt;
      EXPECT_EQ(c.forward(), want);
      EXPECT_EQ(c.backward(), want);
      EXPECT_EQ(bf.forward(), D == 32 || D == 64 || D == 128 ? AttnPath::TensorCore : AttnPath::Simt);
      EXPECT_EQ(bf.backward(), D == 32 || D == 64 ? AttnPath::TensorCore : AttnPath::Simt);
    }
}

TEST(AttentionPath, OtherDtypesOnTheSimtKernels) {
  for (DType dt : kAllDTypes) {
    if (dt == DType::BF16 || dt == DType::F32) continue;
    SCOPED_TRACE(::testing::Message() << dt);
    for (int64_t D : {32, 64, 128})
      for (GemmMath m : {GemmMath::Strict, GemmMath::Tf32, GemmMath::Tf32x3}) {
        Call c(dt, D);
        c.math = m;
        EXPECT_EQ(c.forward(), AttnPath::Simt);
        EXPECT_EQ(c.backward(), AttnPath::Simt);
      }
  }
}

TEST(AttentionPath, ScaleBoundaries) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float tiny = std::numeric_limits<float>::denorm_min(), huge = std::numeric_limits<float>::max();
  // The tensor cores take a finite scale > 0; the tiled f32 kernels any finite scale.
  const struct {
    float scale;
    bool tensor_core, f32_tiled;
  } cases[] = {{0.125f, true, true}, {tiny, true, true},   {huge, true, true},   {0.0f, false, true},
               {-0.0f, false, true}, {-tiny, false, true}, {-0.2f, false, true}, {-huge, false, true},
               {inf, false, false},  {-inf, false, false}, {nan, false, false},  {-nan, false, false}};
  for (const auto& s : cases) {
    SCOPED_TRACE(::testing::Message() << "scale " << s.scale);
    Call bf(DType::BF16, 64), f32(DType::F32, 64), tf32(DType::F32, 64);
    bf.scale = f32.scale = tf32.scale = s.scale;
    tf32.math = GemmMath::Tf32x3;
    const AttnPath want_bf = s.tensor_core ? AttnPath::TensorCore : AttnPath::Simt;
    const AttnPath want_f32 = s.f32_tiled ? AttnPath::F32Tiled : AttnPath::Simt;
    // TF32 math where the tensor cores take the scale, else the strict kernels.
    const AttnPath want_tf32 = s.tensor_core ? AttnPath::TensorCore : want_f32;
    EXPECT_EQ(bf.forward(), want_bf);
    EXPECT_EQ(bf.backward(), want_bf);
    EXPECT_EQ(f32.forward(), want_f32);
    EXPECT_EQ(f32.backward(), want_f32);
    EXPECT_EQ(tf32.forward(), want_tf32);
    EXPECT_EQ(tf32.backward(), want_tf32);
  }
}

/// `c` with the fast path in both directions (a precondition of each case below).
void expect_fast(const Call& c) {
  EXPECT_EQ(c.forward(), fast(c.dt));
  EXPECT_EQ(c.backward(), fast(c.dt));
}

/// The path of `c` in the directions that read view i: the backward reads all
/// eight views, the forward the first four.
void expect_path_of_view(const Call& c, int i, AttnPath want) {
  if (i < 4) {
    EXPECT_EQ(c.forward(), want);
  }
  EXPECT_EQ(c.backward(), want);
}

TEST(AttentionPath, EveryViewPointerOnA16ByteBoundary) {
  for (DType dt : {DType::BF16, DType::F32}) {
    const int64_t es = static_cast<int64_t>(dtype_size(dt));
    for (int i = 0; i < kViews; ++i) {
      SCOPED_TRACE(::testing::Message() << dt << " view " << kViewNames[i]);
      Call c(dt, 64);
      expect_fast(c);
      for (int64_t b = es; b < 16; b += es) {  // every misaligned element offset
        c.bytes[i] = b;
        expect_path_of_view(c, i, AttnPath::Simt);
      }
      c.bytes[i] = 16;
      expect_fast(c);
    }
  }
}

TEST(AttentionPath, EveryViewStrideAMultipleOf16Bytes) {
  for (DType dt : {DType::BF16, DType::F32}) {
    const int64_t n = 16 / static_cast<int64_t>(dtype_size(dt));  // elements in 16 bytes
    for (int i = 0; i < kViews; ++i) {
      for (int which = 0; which < 3; ++which) {  // b, h, t
        SCOPED_TRACE(::testing::Message() << dt << " view " << kViewNames[i] << " stride "
                                          << "bht"[which]);
        Call c(dt, 64);
        int64_t* stride[3] = {&c.strides[i].b, &c.strides[i].h, &c.strides[i].t};
        int64_t* size[3] = {&c.shape.B, &c.shape.H, &c.shape.T};
        const int64_t s0 = *stride[which];
        for (int64_t e = 1; e < n; ++e) {
          *stride[which] = s0 + e;
          expect_path_of_view(c, i, AttnPath::Simt);
        }
        *stride[which] = s0 + n;
        expect_fast(c);
        // A dimension of size 1 never applies its stride.
        *stride[which] = s0 + 1;
        *size[which] = 1;
        expect_fast(c);
      }
    }
  }
}

TEST(AttentionPath, KeyValueViewsUseTheKeyValueHeadCount) {
  // Grouped-query attention: the h stride of k, v, dk, dv applies to their Hkv
  // heads, that of q, o, dout, dq to the H query heads.
  for (DType dt : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(::testing::Message() << dt);
    for (int i = 0; i < kViews; ++i) {
      const bool kv = i == 1 || i == 2 || i == 6 || i == 7;
      SCOPED_TRACE(kViewNames[i]);
      Call c(dt, 64);
      c.shape.H = 4, c.shape.Hkv = 2;
      c.strides[i].h += 1;  // misaligned rows of head 1
      expect_path_of_view(c, i, AttnPath::Simt);
      c.shape.Hkv = 1;  // one key/value head: its h stride is never applied
      if (kv)
        expect_fast(c);
      else
        expect_path_of_view(c, i, AttnPath::Simt);
    }
  }
}

TEST(AttentionPath, NullViewOnTheSimtKernels) {
  // The dispatcher rejects null buffers before it asks; the selector never calls them aligned.
  Call c(DType::BF16, 64);
  AttnForward f;
  f.dt = c.dt, f.shape = c.shape, f.scale = c.scale;
  f.q = f.k = f.v = c.ptr(0);
  f.o = nullptr;
  f.sq = f.sk = f.sv = f.so = c.strides[0];
  EXPECT_EQ(attention_forward_path(f), AttnPath::Simt);
}

TEST(AttentionPath, FusedQkvLayouts) {
  // The GPU tests' layouts: q, k, v slices of [B, T, 3, H, D] with t-rows padded
  // by `pad` elements. A pad of 16 bytes keeps the fast paths; less does not.
  const struct {
    DType dt;
    int64_t pad;
    AttnPath want;
  } cases[] = {{DType::BF16, 0, AttnPath::TensorCore}, {DType::BF16, 8, AttnPath::TensorCore},
               {DType::BF16, 4, AttnPath::Simt},       {DType::BF16, 1, AttnPath::Simt},
               {DType::F32, 0, AttnPath::F32Tiled},    {DType::F32, 4, AttnPath::F32Tiled},
               {DType::F32, 2, AttnPath::Simt},        {DType::F32, 1, AttnPath::Simt}};
  for (const auto& x : cases) {
    SCOPED_TRACE(::testing::Message() << x.dt << " pad " << x.pad);
    Call c(x.dt, 64);
    const AttnShape& s = c.shape;
    const int64_t row = 3 * s.H * s.D + x.pad;
    const AttnStrides fused{s.T * row, s.D, row};
    for (int i : {0, 1, 2, 5, 6, 7}) c.strides[i] = fused;  // q, k, v and their gradients
    EXPECT_EQ(c.forward(), x.want);
    EXPECT_EQ(c.backward(), x.want);
  }
}

}  // namespace
}  // namespace bt::kernels
