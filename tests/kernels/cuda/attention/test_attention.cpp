// GPU causal attention forward/backward against the CPU kernels: T not a
// multiple of the tiles, several head dims, contiguous and fused-QKV strides.
// The TensorCore* tests run the bf16 mma.sync path (D in {32, 64, 128},
// 16-byte aligned rows), the Tf32* tests the same kernels on f32 operands as
// TF32 and 3xTF32 (Note [Attention in fp32]), and the F32Tiled* tests the
// register-tiled strict fp32 path (D in {32, 64}, 16-byte aligned rows), each
// against the CPU float64 kernels on the same values, plus their
// determinism; the Simt* and
// Unaligned* tests run the SIMT fallback, also on shapes the fast paths take.
// The GroupedQuery* tests run each path with Hkv in {H, H / 2, 1} key/value
// heads (Note [Grouped-query attention]), and the determinism of their backward.
// On an sm_90 device the bf16 forward and backward at D = 64 can run the
// Hopper wgmma kernels (cuda::set_attention_wgmma): the TensorCore* tests turn
// them off to test the mma.sync kernels, and the Wgmma* tests on (they skip
// where they are not available).
// A test named after a path first asserts that its calls take that path
// (cuda::attention_*_path, which the dispatcher switches on; its host test is
// tests/kernels/common/test_attention_path.cpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/attention.h"
#include "tests/kernels/cuda/gpu_test_util.h"

namespace bt::test::gpu {
namespace {
namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;
using kernels::AttnBackward;
using kernels::AttnForward;
using kernels::AttnPath;
using kernels::AttnShape;
using kernels::AttnStrides;
using kernels::GemmMath;

struct Case {
  int64_t B, H, T, D;
  bool fused;       // q/k/v (and their grads) are slices of one [B, T, 3, H, D] buffer
  int64_t Hkv = 0;  // key/value heads (0: H); run_vs_f64 only
};

/// Element positions of the [B, H, T, D] view (in b, h, t, d order).
std::vector<int64_t> positions(const AttnShape& s, const AttnStrides& st, int64_t base) {
  std::vector<int64_t> p;
  p.reserve(static_cast<size_t>(s.B * s.H * s.T * s.D));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t t = 0; t < s.T; ++t)
        for (int64_t d = 0; d < s.D; ++d) p.push_back(base + b * st.b + h * st.h + t * st.t + d);
  return p;
}

std::vector<double> gather(const HostBuf& h, const std::vector<int64_t>& pos) {
  std::vector<double> v(pos.size());
  for (size_t i = 0; i < pos.size(); ++i) v[i] = h.get(pos[i]);
  return v;
}

void run_case(DType dt, const Case& c, std::mt19937& gen) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " B " << c.B << " H " << c.H << " T " << c.T << " D "
                                    << c.D << (c.fused ? " fused" : " contiguous"));
  const AttnShape s{c.B, c.H, c.T, c.D};
  const int64_t n = c.B * c.H * c.T * c.D;
  const size_t es = dtype_size(dt);
  // Inputs: one buffer of 3n holding q, k, v (fused: [B, T, 3, H, D]; else three [B, H, T, D] blocks).
  AttnStrides sq, sk, sv;
  int64_t oq, ok, ov;
  if (c.fused) {
    sq = sk = sv = AttnStrides{c.T * 3 * c.H * c.D, c.D, 3 * c.H * c.D};
    oq = 0, ok = c.H * c.D, ov = 2 * c.H * c.D;
  } else {
    sq = sk = sv = kernels::contiguous_bhtd(s);
    oq = 0, ok = n, ov = 2 * n;
  }
  const AttnStrides so = kernels::contiguous_bhtd(s);
  const HostBuf qkv = randn_buf(dt, 3 * n, gen);
  const HostBuf dout = randn_buf(dt, n, gen);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  const auto at = [&](const HostBuf& h, int64_t off) {
    return static_cast<const unsigned char*>(h.data()) + off * es;
  };

  // ---- forward
  HostBuf o_ref(dt, n);
  std::vector<float> lse_ref(static_cast<size_t>(c.B * c.H * c.T));
  AttnForward f;
  f.dt = dt;
  f.shape = s;
  f.scale = scale;
  f.q = at(qkv, oq), f.sq = sq;
  f.k = at(qkv, ok), f.sk = sk;
  f.v = at(qkv, ov), f.sv = sv;
  f.o = o_ref.data(), f.so = so;
  f.lse = lse_ref.data();
  cpu::attention_forward(f);

  DevBuf dqkv(qkv), d_o(static_cast<size_t>(n) * es), d_lse(lse_ref.size() * sizeof(float));
  d_o.poison();
  d_lse.poison();
  AttnForward fg = f;
  fg.q = dqkv.as<unsigned char>() + oq * es;
  fg.k = dqkv.as<unsigned char>() + ok * es;
  fg.v = dqkv.as<unsigned char>() + ov * es;
  fg.o = d_o.get();
  fg.lse = d_lse.as<float>();
  cuda::attention_forward(fg, nullptr);
  BT_EXPECT_REL(d_o.to_host(dt, n).vals(), o_ref.vals(), tol(dt), "o");
  BT_EXPECT_REL(to_doubles(d_lse.to_vector<float>(lse_ref.size())), to_doubles(lse_ref), 1e-5, "lse");

  // ---- backward from the CPU's o and lse on both sides; grads into the same layout as the inputs.
  HostBuf dqkv_ref(dt, 3 * n);
  AttnBackward bw;
  bw.dt = dt;
  bw.shape = s;
  bw.scale = scale;
  bw.q = f.q, bw.sq = sq;
  bw.k = f.k, bw.sk = sk;
  bw.v = f.v, bw.sv = sv;
  bw.o = o_ref.data(), bw.so = so;
  bw.dout = dout.data(), bw.sdo = so;
  bw.lse = lse_ref.data();
  unsigned char* gref = static_cast<unsigned char*>(dqkv_ref.data());
  bw.dq = gref + oq * es, bw.sdq = sq;
  bw.dk = gref + ok * es, bw.sdk = sk;
  bw.dv = gref + ov * es, bw.sdv = sv;
  cpu::attention_backward(bw);

  DevBuf d_o_ref(o_ref), d_dout(dout), d_lse_ref(upload_vector(lse_ref)),
      d_grads(static_cast<size_t>(3 * n) * es);
  // The least scratch: the strict-fp32 backward recomputes dS in its dQ pass
  // (run_vs_f64 gives each call what runs fastest).
  DevBuf scratch(cuda::attention_backward_scratch_floats(s) * sizeof(float));
  d_grads.poison();
  scratch.poison();
  AttnBackward bg = bw;
  bg.q = fg.q, bg.k = fg.k, bg.v = fg.v;
  bg.o = d_o_ref.get();
  bg.dout = d_dout.get();
  bg.lse = d_lse_ref.as<float>();
  bg.dq = d_grads.as<unsigned char>() + oq * es;
  bg.dk = d_grads.as<unsigned char>() + ok * es;
  bg.dv = d_grads.as<unsigned char>() + ov * es;
  cuda::attention_backward(bg, scratch.as<float>(), nullptr);
  const HostBuf grads = d_grads.to_host(dt, 3 * n);
  BT_EXPECT_REL(gather(grads, positions(s, sq, oq)), gather(dqkv_ref, positions(s, sq, oq)), tol(dt), "dq");
  BT_EXPECT_REL(gather(grads, positions(s, sk, ok)), gather(dqkv_ref, positions(s, sk, ok)), tol(dt), "dk");
  BT_EXPECT_REL(gather(grads, positions(s, sv, ov)), gather(dqkv_ref, positions(s, sv, ov)), tol(dt), "dv");
}

TEST(CudaAttention, MatchesCpu) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int64_t T : {1, 17, 64, 257})
      for (int64_t D : {32, 64}) run_case(dt, {2, 3, T, D, false}, gen);
    run_case(dt, {2, 2, 65, 64, true}, gen);
    run_case(dt, {1, 2, 33, 16, false}, gen);
    run_case(dt, {1, 2, 33, 128, true}, gen);
    run_case(dt, {1, 1, 100, 40, false}, gen);  // D padded to 64
    run_case(dt, {1, 1, 31, 1, false}, gen);    // D padded to 16
  }
}

/// The relative error allowed against float64: bf16's, fp32's, or one TF32
/// product's (10 bits of mantissa: about 1e-3 on these outputs); 3xTF32 is
/// held to fp32's (Note [Attention in fp32]).
/// Tf32: one TF32 product's ~1e-3. Tf32x3: 3xTF32's error on an H100 grows
/// with the length summed, since the tensor cores' f32 accumulation does not
/// round to nearest (measured: dK and dV 1.1e-5 at T = 1024, 3.1e-5 when four
/// query heads share a K/V head, against strict fp32's < 1e-5).
double tol_of(DType dt, GemmMath math) {
  if (dt == DType::F32 && math == GemmMath::Tf32) return 4e-3;
  if (dt == DType::F32 && math == GemmMath::Tf32x3) return 1e-4;
  return tol(dt);
}

/// Turns the Hopper wgmma forward on or off for a scope (cuda::set_attention_wgmma).
class WgmmaScope {
 public:
  explicit WgmmaScope(bool on) : prev_(cuda::attention_wgmma_enabled()) { cuda::set_attention_wgmma(on); }
  ~WgmmaScope() { cuda::set_attention_wgmma(prev_); }
  WgmmaScope(const WgmmaScope&) = delete;
  WgmmaScope& operator=(const WgmmaScope&) = delete;

 private:
  bool prev_;
};

/// A BF16 D = 64 call on the tensor-core path, as run_vs_f64 makes one: do
/// its forward and its backward run the wgmma kernels? (They are switched
/// together: asserts that both do or neither does.)
bool uses_wgmma(int64_t H, int64_t Hkv) {
  static unsigned char arena[64];  // aligned enough: never read
  void* p = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(arena) + 15) & ~uintptr_t{15});
  const AttnShape shape{1, H, 128, 64, Hkv};
  const AttnStrides st{0, 64 * 128, 64};
  AttnForward f;
  f.dt = DType::BF16;
  f.shape = shape;
  f.scale = 0.125f;
  f.q = f.k = f.v = f.o = p;
  f.sq = f.sk = f.sv = f.so = st;
  AttnBackward b;
  b.dt = DType::BF16;
  b.shape = shape;
  b.scale = 0.125f;
  b.q = b.k = b.v = b.o = b.dout = b.dq = b.dk = b.dv = p;
  b.sq = b.sk = b.sv = b.so = b.sdo = b.sdq = b.sdk = b.sdv = st;
  const bool fwd = cuda::attention_forward_uses_wgmma(f), bwd = cuda::attention_backward_uses_wgmma(b);
  EXPECT_EQ(fwd, bwd) << "the wgmma forward and backward are switched together";
  return fwd && bwd;
}

/// The paths a forward and a backward call must take.
struct Paths {
  AttnPath fwd, bwd;
};
constexpr Paths kTensorCore{AttnPath::TensorCore, AttnPath::TensorCore};
constexpr Paths kF32Tiled{AttnPath::F32Tiled, AttnPath::F32Tiled};
constexpr Paths kSimt{AttnPath::Simt, AttnPath::Simt};

/// Fused [B, T, H + 2 Hkv, D] q/k/v (q's H heads, then k's and v's Hkv: a
/// fused projection; [B, T, 3, H, D] without GQA; each t-row padded by `t_pad`
/// elements, the buffer starting `shift` elements into its allocation) in `dt` (bf16 or f32)
/// on the GPU; the CPU float64 kernels on the same values are the reference.
/// The calls must take the paths `want`. The GPU backward consumes the GPU
/// forward's o and lse, as in training. Gradients land in a fused buffer of the
/// same layout. `scale` 0 means 1 / sqrt(D). F32 products multiply as `math`
/// says; the tolerance is the math's (tol_of). `worst`, if given, receives the
/// largest relative error of o, dq, dk and dv.
void run_vs_f64(const Case& c, std::mt19937& gen, Paths want, double stddev = 1.0, int64_t t_pad = 0,
                DType dt = DType::BF16, float scale = 0.0f, int64_t shift = 0,
                GemmMath math = GemmMath::Strict, double* worst = nullptr) {
  const AttnShape s{c.B, c.H, c.T, c.D, c.Hkv};
  const int64_t Hkv = s.kv_heads();
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " vs f64: B " << c.B << " H " << c.H << " Hkv "
                                    << Hkv << " T " << c.T << " D " << c.D << " stddev " << stddev
                                    << " t_pad " << t_pad << " scale " << scale << " shift " << shift
                                    << " math " << static_cast<int>(math));
  const size_t es = dtype_size(dt);
  const double tl = tol_of(dt, math);
  double worst_err = 0;
  const auto expect_rel = [&](const std::vector<double>& got, const std::vector<double>& ref,
                              const char* what) {
    const double err = rel_error(got, ref);
    worst_err = std::max(worst_err, err);
    EXPECT_LT(err, tl) << what << ": relative error " << err;
  };
  const int64_t n = c.B * c.H * c.T * c.D, width = (c.H + 2 * Hkv) * c.D, row = width + t_pad,
                total = shift + c.B * c.T * row;
  const AttnStrides sqkv{c.T * row, c.D, row};
  const int64_t oq = shift, ok = shift + c.H * c.D, ov = shift + (c.H + Hkv) * c.D;
  // Element positions of q's view (oq) or of k's or v's ([B, Hkv, T, D]).
  AttnShape kv_shape = s;
  kv_shape.H = Hkv;
  const auto pos = [&](int64_t off) { return positions(off == oq ? s : kv_shape, sqkv, off); };
  const AttnStrides so = kernels::contiguous_bhtd(s);
  if (scale == 0.0f) scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  const HostBuf qkv = randn_buf(dt, total, gen, stddev), dout = randn_buf(dt, n, gen);
  HostBuf qkv64(DType::F64, qkv.vals()), dout64(DType::F64, dout.vals());
  const auto at64 = [](HostBuf& h, int64_t off) { return h.as<double>() + off; };

  // ---- float64 reference forward
  HostBuf o64(DType::F64, n), g64(DType::F64, total);
  std::vector<float> lse64(static_cast<size_t>(c.B * c.H * c.T));
  AttnForward f;
  f.dt = DType::F64;
  f.shape = s;
  f.scale = scale;
  f.q = at64(qkv64, oq), f.sq = sqkv;
  f.k = at64(qkv64, ok), f.sk = sqkv;
  f.v = at64(qkv64, ov), f.sv = sqkv;
  f.o = o64.data(), f.so = so;
  f.lse = lse64.data();
  cpu::attention_forward(f);

  // ---- GPU, dt
  DevBuf d_qkv(qkv), d_o(static_cast<size_t>(n) * es), d_lse(lse64.size() * sizeof(float)), d_dout(dout),
      d_grads(static_cast<size_t>(total) * es);
  d_o.poison();
  d_lse.poison();
  d_grads.poison();
  const auto dev = [es](const DevBuf& d, int64_t off) { return d.as<unsigned char>() + off * es; };
  AttnForward fg;
  fg.dt = dt;
  fg.math = math;
  fg.shape = s;
  fg.scale = scale;
  fg.q = dev(d_qkv, oq), fg.sq = sqkv;
  fg.k = dev(d_qkv, ok), fg.sk = sqkv;
  fg.v = dev(d_qkv, ov), fg.sv = sqkv;
  fg.o = d_o.get(), fg.so = so;
  fg.lse = d_lse.as<float>();
  ASSERT_EQ(cuda::attention_forward_path(fg), want.fwd) << "forward path";
  cuda::attention_forward(fg, nullptr);
  expect_rel(d_o.to_host(dt, n).vals(), o64.vals(), "o");
  // lse is f32 arithmetic on the rounded inputs the reference sees too: 1e-5,
  // unless TF32 products round the scores themselves.
  const double lse_tol = dt == DType::F32 && math != GemmMath::Strict ? tl : 1e-5;
  BT_EXPECT_REL(to_doubles(d_lse.to_vector<float>(lse64.size())), to_doubles(lse64), lse_tol, "lse");

  // ---- float64 reference backward. Its Di = rowsum(dO * O) uses the o the GPU
  // backward gets, so that only the kernels' arithmetic is compared.
  HostBuf o_used(DType::F64, d_o.to_host(dt, n).vals());
  AttnBackward bw;
  bw.dt = DType::F64;
  bw.shape = s;
  bw.scale = scale;
  bw.q = f.q, bw.sq = sqkv;
  bw.k = f.k, bw.sk = sqkv;
  bw.v = f.v, bw.sv = sqkv;
  bw.o = o_used.data(), bw.so = so;
  bw.dout = dout64.data(), bw.sdo = so;
  bw.lse = lse64.data();
  bw.dq = at64(g64, oq), bw.sdq = sqkv;
  bw.dk = at64(g64, ok), bw.sdk = sqkv;
  bw.dv = at64(g64, ov), bw.sdv = sqkv;
  cpu::attention_backward(bw);

  AttnBackward bg;
  bg.dt = dt;
  bg.math = math;
  bg.shape = s;
  bg.scale = scale;
  bg.q = fg.q, bg.sq = sqkv;
  bg.k = fg.k, bg.sk = sqkv;
  bg.v = fg.v, bg.sv = sqkv;
  bg.o = d_o.get(), bg.so = so;
  bg.dout = d_dout.get(), bg.sdo = so;
  bg.lse = d_lse.as<float>();
  bg.dq = dev(d_grads, oq), bg.sdq = sqkv;
  bg.dk = dev(d_grads, ok), bg.sdk = sqkv;
  bg.dv = dev(d_grads, ov), bg.sdv = sqkv;
  ASSERT_EQ(cuda::attention_backward_path(bg), want.bwd) << "backward path";
  const size_t floats = cuda::attention_backward_scratch_floats(bg);  // the fastest way
  DevBuf scratch(floats * sizeof(float));
  scratch.poison();
  cuda::attention_backward(bg, scratch.as<float>(), nullptr, floats);
  const HostBuf grads = d_grads.to_host(dt, total);
  if (c.T > 1) {
    expect_rel(gather(grads, pos(oq)), gather(g64, pos(oq)), "dq");
    expect_rel(gather(grads, pos(ok)), gather(g64, pos(ok)), "dk");
  } else {
    // One key per query: P = 1 and dS = dP - rowsum(dO * O) cancels to rounding
    // noise, so dq = scale dS K and dk = scale dS^T Q are noise in both; a
    // relative error means nothing. Their difference is bounded by the terms
    // that cancel: |dP| <= D max|dO| max|V| (dk: for each of the G query heads it sums).
    auto amax = [](const std::vector<double>& v) {
      double m = 0;
      for (double x : v) m = std::max(m, std::abs(x));
      return m;
    };
    const double dp = static_cast<double>(c.D) * amax(dout.vals()) * amax(gather(qkv, pos(ov)));
    for (const auto& [off, other, name] : {std::tuple{oq, ok, "dq"}, std::tuple{ok, oq, "dk"}}) {
      const std::vector<double> got = gather(grads, pos(off)), want = gather(g64, pos(off));
      double err = 0;
      for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::abs(got[i] - want[i]));
      const double heads = off == ok ? static_cast<double>(s.group()) : 1.0;
      EXPECT_LE(err, heads * tl * std::abs(scale) * dp * amax(gather(qkv, pos(other)))) << name;
    }
  }
  expect_rel(gather(grads, pos(ov)), gather(g64, pos(ov)), "dv");
  if (worst) *worst = worst_err;
  // The shift before the buffer and the padding between rows are no element
  // of any view: still poisoned.
  int64_t written = 0;
  for (int64_t e = 0; e < shift; ++e) written += !std::isnan(grads.get(e));
  for (int64_t r = 0; r < c.B * c.T; ++r)
    for (int64_t e = width; e < row; ++e) written += !std::isnan(grads.get(shift + r * row + e));
  EXPECT_EQ(written, 0) << "gradient kernels wrote outside the views";
}

TEST(CudaAttention, TensorCorePathMatchesFloat64) {
  BT_SKIP_WITHOUT_GPU();
  WgmmaScope mma_sync(false);
  ASSERT_FALSE(uses_wgmma(3, 0));
  BT_SEED(seed);
  std::mt19937 gen(seed);
  for (int64_t T : {1, 17, 100, 257}) run_vs_f64({2, 3, T, 64, true}, gen, kTensorCore);
  run_vs_f64({1, 2, 1024, 64, true}, gen, kTensorCore);
  run_vs_f64({2, 2, 200, 64, true}, gen, kTensorCore, 2.5);  // peaked softmax: large running-max corrections
  run_vs_f64({2, 2, 130, 64, true}, gen, kTensorCore, 1.0, 8);  // padded rows, still 16-byte aligned
  run_vs_f64({2, 3, 150, 32, true}, gen, kTensorCore);
  run_vs_f64({1, 2, 150, 128, true}, gen, {AttnPath::TensorCore, AttnPath::Simt});  // no D = 128 backward
}

TEST(CudaAttention, UnalignedBf16RowsUseTheSimtPath) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  run_vs_f64({2, 2, 70, 64, true}, gen, kSimt, 1.0, 1);  // t stride 3HD + 1: rows not 16-byte aligned
}

/// Bytes of a device buffer.
std::vector<unsigned char> bytes_of(const DevBuf& d) { return d.to_vector<unsigned char>(d.bytes()); }

/// The backward of forward `f` over a fused q/k/v buffer (its dtype, math,
/// scale, q, k, v, o and lse): dO at `dout` in o's layout, the gradients into
/// `grads`, a buffer of the fused layout (dq's view at 0, dk's at H D and dv's
/// at (H + Hkv) D elements, with the strides of q, k and v).
AttnBackward backward_of(const AttnForward& f, const void* dout, unsigned char* grads) {
  AttnBackward b;
  b.dt = f.dt;
  b.math = f.math;
  b.shape = f.shape;
  b.scale = f.scale;
  b.q = f.q, b.k = f.k, b.v = f.v;
  b.sq = b.sdq = f.sq, b.sk = b.sdk = f.sk, b.sv = b.sdv = f.sv;
  b.o = f.o, b.so = f.so;
  b.dout = dout, b.sdo = f.so;
  b.lse = f.lse;
  const size_t es = dtype_size(f.dt);
  const int64_t H = f.shape.H, KH = f.shape.kv_heads(), D = f.shape.D;
  b.dq = grads, b.dk = grads + H * D * es, b.dv = grads + (H + KH) * D * es;
  return b;
}

/// Two forward + backward runs on the same inputs (fused q/k/v [B, T, H + 2
/// Hkv, D], B 2, T 333, H 3 or, with Hkv, 4), on the path `want`, give the same
/// bytes in o, lse, dq, dk and dv (with GQA, dk and dv are sums over query heads).
void check_deterministic(DType dt, int64_t D, AttnPath want, int64_t Hkv = 0,
                         GemmMath math = GemmMath::Strict) {
  BT_SEED(seed);
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " D " << D << " Hkv " << Hkv << " math "
                                    << static_cast<int>(math));
  std::mt19937 gen(seed);
  const size_t es = dtype_size(dt);
  const int64_t B = 2, H = Hkv ? 4 : 3, KH = Hkv ? Hkv : H, T = 333, row = (H + 2 * KH) * D;
  const AttnShape s{B, H, T, D, Hkv};
  const int64_t n = B * H * T * D;
  const AttnStrides sqkv{T * row, D, row}, so = kernels::contiguous_bhtd(s);
  DevBuf d_qkv(randn_buf(dt, B * T * row, gen)), d_dout(randn_buf(dt, n, gen));
  const auto dev = [es](const DevBuf& d, int64_t off) { return d.as<unsigned char>() + off * es; };
  std::vector<unsigned char> o_first, lse_first, g_first;
  for (int run = 0; run < 2; ++run) {
    DevBuf d_o(static_cast<size_t>(n) * es), d_lse(static_cast<size_t>(B * H * T) * sizeof(float)),
        d_grads(static_cast<size_t>(B * T * row) * es);
    d_o.poison();
    d_lse.poison();
    d_grads.poison();
    AttnForward f;
    f.dt = dt;
    f.math = math;
    f.shape = s;
    f.scale = 0.125f;
    f.q = dev(d_qkv, 0), f.k = dev(d_qkv, H * D), f.v = dev(d_qkv, (H + KH) * D);
    f.sq = f.sk = f.sv = sqkv;
    f.o = d_o.get(), f.so = so;
    f.lse = d_lse.as<float>();
    ASSERT_EQ(cuda::attention_forward_path(f), want) << "forward path";
    cuda::attention_forward(f, nullptr);
    const AttnBackward b = backward_of(f, d_dout.get(), d_grads.as<unsigned char>());
    ASSERT_EQ(cuda::attention_backward_path(b), want) << "backward path";
    const size_t floats = cuda::attention_backward_scratch_floats(b);  // the fastest way
    DevBuf scratch(floats * sizeof(float));
    scratch.poison();
    cuda::attention_backward(b, scratch.as<float>(), nullptr, floats);
    if (run == 0) {
      o_first = bytes_of(d_o), lse_first = bytes_of(d_lse), g_first = bytes_of(d_grads);
      continue;
    }
    EXPECT_EQ(first_byte_mismatch(bytes_of(d_o), o_first, es), -1) << "o differs between two runs";
    EXPECT_EQ(first_byte_mismatch(bytes_of(d_lse), lse_first, 4), -1) << "lse differs between two runs";
    EXPECT_EQ(first_byte_mismatch(bytes_of(d_grads), g_first, es), -1) << "dq/dk/dv differ between two runs";
  }
}

TEST(CudaAttention, TensorCorePathIsDeterministic) {
  BT_SKIP_WITHOUT_GPU();
  WgmmaScope mma_sync(false);
  check_deterministic(DType::BF16, 64, AttnPath::TensorCore);
}

// The wgmma kernels are the default where they exist (BT_ATTENTION_WGMMA=0 turns them off).
TEST(CudaAttention, WgmmaIsTheDefault) {
  BT_SKIP_WITHOUT_GPU();
  const char* env = std::getenv("BT_ATTENTION_WGMMA");
  const bool off = env != nullptr && std::string(env) == "0";
  EXPECT_EQ(cuda::attention_wgmma_enabled(), !off);
  EXPECT_EQ(uses_wgmma(3, 0), !off && cuda::attention_wgmma_available());
}

// The Hopper forward's tiles come through the copy engine, which cannot step
// by a zero stride: such views keep the mma.sync forward.
TEST(CudaAttention, WgmmaForwardNeedsPositiveStrides) {
  BT_SKIP_WITHOUT_GPU();
  if (!cuda::attention_wgmma_available())
    GTEST_SKIP() << "no sm_90a kernels in this build or not an sm_90 device";
  WgmmaScope on(true);
  static unsigned char arena[64];  // aligned enough: never read
  void* p = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(arena) + 15) & ~uintptr_t{15});
  AttnForward f;
  f.dt = DType::BF16;
  f.shape = AttnShape{2, 4, 128, 64, 2};
  f.scale = 0.125f;
  f.q = f.k = f.v = f.o = p;
  f.sq = f.so = kernels::contiguous_bhtd(f.shape);
  f.sk = f.sv = kernels::contiguous_kv_bhtd(f.shape);
  EXPECT_TRUE(cuda::attention_forward_uses_wgmma(f));
  f.sk.h = 0;  // both K/V heads read the same rows
  EXPECT_EQ(cuda::attention_forward_path(f), AttnPath::TensorCore);
  EXPECT_FALSE(cuda::attention_forward_uses_wgmma(f));
  f.sk = kernels::contiguous_kv_bhtd(f.shape);
  f.sv.b = 0;
  EXPECT_FALSE(cuda::attention_forward_uses_wgmma(f));
  f.sv = kernels::contiguous_kv_bhtd(f.shape);
  f.shape.B = 1;  // a dimension of one entry never steps: its stride does not matter
  f.sq.b = 0;
  EXPECT_TRUE(cuda::attention_forward_uses_wgmma(f));
}

TEST(CudaAttention, WgmmaMatchesFloat64) {
  BT_SKIP_WITHOUT_GPU();
  if (!cuda::attention_wgmma_available())
    GTEST_SKIP() << "no sm_90a kernels in this build or not an sm_90 device";
  WgmmaScope on(true);
  ASSERT_TRUE(uses_wgmma(3, 0));
  BT_SEED(seed);
  std::mt19937 gen(seed);
  for (int64_t T : {1, 17, 64, 100, 129, 257, 1024}) run_vs_f64({2, 3, T, 64, true}, gen, kTensorCore);
  run_vs_f64({2, 2, 200, 64, true}, gen, kTensorCore, 2.5);  // peaked softmax: large running-max corrections
  run_vs_f64({2, 2, 130, 64, true}, gen, kTensorCore, 1.0, 8);  // padded rows, still 16-byte aligned
  for (int64_t Hkv : {2, 1}) {
    ASSERT_TRUE(uses_wgmma(4, Hkv));
    for (int64_t T : {17, 257}) run_vs_f64({2, 4, T, 64, true, Hkv}, gen, kTensorCore);
    run_vs_f64({1, 8, 1024, 64, true, 2}, gen, kTensorCore);
  }
  // The other head dims keep the mma.sync kernels.
  run_vs_f64({2, 3, 150, 32, true}, gen, kTensorCore);
}

TEST(CudaAttention, WgmmaIsDeterministic) {
  BT_SKIP_WITHOUT_GPU();
  if (!cuda::attention_wgmma_available())
    GTEST_SKIP() << "no sm_90a kernels in this build or not an sm_90 device";
  WgmmaScope on(true);
  check_deterministic(DType::BF16, 64, AttnPath::TensorCore);
  check_deterministic(DType::BF16, 64, AttnPath::TensorCore, 2);
}

TEST(CudaAttention, F32TiledPathMatchesFloat64) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  const DType f32 = DType::F32;
  for (int64_t T : {1, 17, 100, 257, 1024}) run_vs_f64({2, 3, T, 64, true}, gen, kF32Tiled, 1.0, 0, f32);
  run_vs_f64({2, 2, 200, 64, true}, gen, kF32Tiled, 2.5, 0,
             f32);  // peaked softmax: large running-max corrections
  run_vs_f64({2, 2, 130, 64, true}, gen, kF32Tiled, 1.0, 4, f32);  // padded rows, still 16-byte aligned
  run_vs_f64({1, 3, 190, 64, true}, gen, kF32Tiled, 1.0, 0, f32, -0.2f);  // a negative scale
  for (int64_t T : {1, 17, 100, 257}) run_vs_f64({2, 3, T, 32, true}, gen, kF32Tiled, 1.0, 0, f32);
}

TEST(CudaAttention, Tf32TensorCorePathMatchesFloat64) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  const DType f32 = DType::F32;
  for (GemmMath m : {GemmMath::Tf32, GemmMath::Tf32x3}) {
    for (int64_t T : {1, 17, 100, 257, 1024})
      run_vs_f64({2, 3, T, 64, true}, gen, kTensorCore, 1.0, 0, f32, 0, 0, m);
    run_vs_f64({2, 2, 200, 64, true}, gen, kTensorCore, 2.5, 0, f32, 0, 0, m);  // peaked softmax
    run_vs_f64({2, 2, 130, 64, true}, gen, kTensorCore, 1.0, 4, f32, 0, 0, m);  // padded rows, still aligned
    for (int64_t T : {1, 17, 100, 257})
      run_vs_f64({2, 3, T, 32, true}, gen, kTensorCore, 1.0, 0, f32, 0, 0, m);
    // A scale <= 0 is no tensor-core scale (the online softmax's max): strict kernels.
    run_vs_f64({1, 3, 190, 64, true}, gen, kF32Tiled, 1.0, 0, f32, -0.2f, 0, m);
  }
}

// 3xTF32 is what makes TF32 tensor cores fit for fp32 work: on the same
// inputs its error against float64 must stay within an order of magnitude of
// the strict fp32 kernels' (measured on an H100: 6.7x at D = 32, the tensor
// cores' accumulation truncating) and far below one TF32 product's (190x
// below), or the split is not doing its job.
TEST(CudaAttention, Tf32x3IsAsCloseToFloat64AsStrictFp32) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  for (int64_t D : {32, 64}) {
    double err[3];
    const GemmMath maths[3] = {GemmMath::Strict, GemmMath::Tf32x3, GemmMath::Tf32};
    for (int i = 0; i < 3; ++i) {
      std::mt19937 gen(seed);  // the same inputs for each math
      run_vs_f64({2, 4, 300, D, true}, gen, i == 0 ? kF32Tiled : kTensorCore, 1.0, 0, DType::F32, 0, 0,
                 maths[i], &err[i]);
    }
    SCOPED_TRACE(::testing::Message() << "D " << D << " worst relative error: strict " << err[0]
                                      << ", 3xTF32 " << err[1] << ", TF32 " << err[2]);
    EXPECT_LT(err[1], 20 * err[0]);
    EXPECT_LT(50 * err[1], err[2]);
  }
}

TEST(CudaAttention, Tf32TensorCorePathIsDeterministic) {
  BT_SKIP_WITHOUT_GPU();
  for (GemmMath m : {GemmMath::Tf32, GemmMath::Tf32x3})
    for (int64_t Hkv : {0, 2}) {
      check_deterministic(DType::F32, 64, AttnPath::TensorCore, Hkv, m);
      check_deterministic(DType::F32, 32, AttnPath::TensorCore, Hkv, m);
    }
}

TEST(CudaAttention, F32TiledPathIsDeterministic) {
  BT_SKIP_WITHOUT_GPU();
  check_deterministic(DType::F32, 64, AttnPath::F32Tiled);
  check_deterministic(DType::F32, 32, AttnPath::F32Tiled);
}

// Note [dS through memory in fp32]: the backward through dS tiles in scratch
// gives the same bits whether its scratch holds every key/value head's tiles
// at once or one head's (spans of one head, four launches of each pass); with
// the least scratch it recomputes dS instead, which agrees within fp32's
// tolerance; less than the least is refused. Grouped queries (G = 2), and T
// and B H T multiples of 64, so that the tiles start right after Di.
TEST(CudaAttention, F32TiledBackwardThroughDsInSpans) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  const int64_t B = 2, H = 4, Hkv = 2, T = 192, D = 64, row = (H + 2 * Hkv) * D;
  const AttnShape s{B, H, T, D, Hkv};
  const int64_t n = B * H * T * D;
  const AttnStrides sqkv{T * row, D, row}, so = kernels::contiguous_bhtd(s);
  const size_t f4 = sizeof(float);
  DevBuf d_qkv(randn_buf(DType::F32, B * T * row, gen)), d_dout(randn_buf(DType::F32, n, gen)),
      d_o(static_cast<size_t>(n) * f4), d_lse(static_cast<size_t>(B * H * T) * f4),
      d_grads(static_cast<size_t>(B * T * row) * f4);
  AttnForward f;
  f.shape = s;
  f.scale = 0.125f;
  f.q = d_qkv.as<float>(), f.k = d_qkv.as<float>() + H * D, f.v = d_qkv.as<float>() + (H + Hkv) * D;
  f.sq = f.sk = f.sv = sqkv;
  f.o = d_o.get(), f.so = so;
  f.lse = d_lse.as<float>();
  cuda::attention_forward(f, nullptr);
  const AttnBackward b = backward_of(f, d_dout.get(), d_grads.as<unsigned char>());
  ASSERT_EQ(cuda::attention_backward_path(b), AttnPath::F32Tiled);
  const size_t least = cuda::attention_backward_scratch_floats(s),
               all = cuda::attention_backward_scratch_floats(b);
  ASSERT_EQ((all - least) % (B * Hkv), 0u) << "the tiles of B Hkv = 4 heads follow Di";
  const size_t one_head = least + (all - least) / (B * Hkv);
  auto grads = [&](size_t floats) {
    DevBuf scratch(floats * f4);
    d_grads.poison();
    scratch.poison();
    cuda::attention_backward(b, scratch.as<float>(), nullptr, floats);
    return d_grads.to_vector<float>(B * T * row);
  };
  const std::vector<float> whole = grads(all), spans = grads(one_head), recomputed = grads(least);
  ASSERT_EQ(whole.size(), spans.size());
  EXPECT_EQ(std::memcmp(whole.data(), spans.data(), whole.size() * f4), 0)
      << "one launch and four spans give different bits";
  // The recomputing backward builds its own dS for dQ (from S = Q' K^T, where
  // the dK/dV pass has S^T = K' Q^T): other bits, within fp32 rounding (on an
  // H200, 84685 of dq's 98304 elements differed). dK and dV come from the same
  // dK/dV pass and the same Di: the same bits.
  std::vector<double> q_whole, q_rec, kv_whole, kv_rec;
  int64_t q_differ = 0, kv_differ = 0;
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t e = 0; e < row; ++e) {
      const size_t i = static_cast<size_t>(r * row + e);
      const bool q = e < H * D;
      (q ? q_whole : kv_whole).push_back(whole[i]);
      (q ? q_rec : kv_rec).push_back(recomputed[i]);
      (q ? q_differ : kv_differ) += std::memcmp(&whole[i], &recomputed[i], f4) != 0;
    }
  std::printf("elements whose bits differ, recomputed against through memory: dq %lld, dk and dv %lld\n",
              static_cast<long long>(q_differ), static_cast<long long>(kv_differ));
  EXPECT_GT(q_differ, 0) << "the least scratch must take the recomputing backward (its own dQ bits)";
  EXPECT_EQ(kv_differ, 0) << "dK and dV differ between the two backwards";
  BT_EXPECT_REL(q_rec, q_whole, 1e-5, "dq, recomputed against through memory");
  BT_EXPECT_REL(kv_rec, kv_whole, 1e-5, "dk and dv, recomputed against through memory");
  EXPECT_THROW(grads(least - 1), bt::Error) << "less scratch than Di needs";
}

TEST(CudaAttention, UnalignedF32RowsUseTheSimtPath) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  run_vs_f64({2, 2, 70, 64, true}, gen, kSimt, 1.0, 1,
             DType::F32);  // t stride 3HD + 1: rows not 16-byte aligned
}

TEST(CudaAttention, SimtPathOnShapesTheFastPathsTake) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  // Aligned strides, D and dtypes of the fast paths; only the buffer starts one
  // element past a 16-byte boundary, so every view's pointer is misaligned.
  for (DType dt : {DType::BF16, DType::F32})
    for (int64_t D : {32, 64}) run_vs_f64({2, 3, 100, D, true}, gen, kSimt, 1.0, 0, dt, 0.0f, 1);
  // Aligned bf16 with a negative scale: the tensor cores need scale > 0.
  run_vs_f64({2, 2, 130, 64, true}, gen, kSimt, 1.0, 0, DType::BF16, -0.125f);
}

// Grouped-query attention (Note [Grouped-query attention]): H = 4 or 8 query
// heads over Hkv = H (MHA through the same layout), H / 2 and 1 key/value
// heads, q/k/v slices of one fused [B, T, H + 2 Hkv, D] projection, on each path.
TEST(CudaAttention, GroupedQueryTensorCorePathMatchesFloat64) {
  BT_SKIP_WITHOUT_GPU();
  WgmmaScope mma_sync(false);
  BT_SEED(seed);
  std::mt19937 gen(seed);
  for (int64_t Hkv : {4, 2, 1}) {
    for (int64_t T : {1, 17, 257}) run_vs_f64({2, 4, T, 64, true, Hkv}, gen, kTensorCore);
    run_vs_f64({1, 4, 150, 32, true, Hkv}, gen, kTensorCore);
    run_vs_f64({1, 4, 130, 64, true, Hkv}, gen, kTensorCore, 2.5, 8);  // peaked softmax, padded rows
    run_vs_f64({1, 4, 100, 128, true, Hkv}, gen, {AttnPath::TensorCore, AttnPath::Simt});
  }
  run_vs_f64({1, 8, 1024, 64, true, 2}, gen, kTensorCore);  // groups of 4, many query tiles per key tile
}

TEST(CudaAttention, GroupedQueryF32TiledPathMatchesFloat64) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  const DType f32 = DType::F32;
  for (int64_t Hkv : {4, 2, 1}) {
    for (int64_t T : {1, 17, 257}) run_vs_f64({2, 4, T, 64, true, Hkv}, gen, kF32Tiled, 1.0, 0, f32);
    run_vs_f64({1, 4, 150, 32, true, Hkv}, gen, kF32Tiled, 1.0, 0, f32);
    run_vs_f64({1, 4, 130, 64, true, Hkv}, gen, kF32Tiled, 2.5, 4, f32);  // peaked softmax, padded rows
  }
  run_vs_f64({1, 8, 1024, 64, true, 2}, gen, kF32Tiled, 1.0, 0, f32);
}

TEST(CudaAttention, GroupedQueryTf32TensorCorePathMatchesFloat64) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  const DType f32 = DType::F32;
  for (GemmMath m : {GemmMath::Tf32, GemmMath::Tf32x3}) {
    for (int64_t Hkv : {2, 1}) {
      for (int64_t T : {1, 17, 257})
        run_vs_f64({2, 4, T, 64, true, Hkv}, gen, kTensorCore, 1.0, 0, f32, 0, 0, m);
      run_vs_f64({1, 4, 150, 32, true, Hkv}, gen, kTensorCore, 1.0, 0, f32, 0, 0, m);
      run_vs_f64({1, 4, 130, 64, true, Hkv}, gen, kTensorCore, 2.5, 4, f32, 0, 0, m);  // peaked, padded rows
    }
    run_vs_f64({1, 8, 1024, 64, true, 2}, gen, kTensorCore, 1.0, 0, f32, 0, 0, m);
  }
}

TEST(CudaAttention, GroupedQuerySimtPathMatchesFloat64) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  for (DType dt : {DType::BF16, DType::F32})
    for (int64_t Hkv : {4, 2, 1}) {
      run_vs_f64({2, 4, 100, 64, true, Hkv}, gen, kSimt, 1.0, 1, dt);         // unaligned rows
      run_vs_f64({1, 4, 70, 40, true, Hkv}, gen, kSimt, 1.0, 0, dt);          // D padded to 64
      run_vs_f64({2, 4, 1, 32, true, Hkv}, gen, kSimt, 1.0, 0, dt, 0.0f, 1);  // misaligned start
    }
}

TEST(CudaAttention, GroupedQueryBackwardIsDeterministic) {
  BT_SKIP_WITHOUT_GPU();
  for (int64_t Hkv : {2, 1}) {
    check_deterministic(DType::BF16, 64, AttnPath::TensorCore, Hkv);
    check_deterministic(DType::F32, 64, AttnPath::F32Tiled, Hkv);
    check_deterministic(DType::F32, 32, AttnPath::F32Tiled, Hkv);
  }
}

TEST(CudaAttention, RejectsHeadDimAbove128) {
  BT_SKIP_WITHOUT_GPU();
  DevBuf d(1 << 16);
  AttnForward f;
  f.shape = {1, 1, 4, 256};
  f.sq = f.sk = f.sv = f.so = kernels::contiguous_bhtd(f.shape);
  f.q = f.k = f.v = d.get();
  f.o = d.get();
  EXPECT_THROW(cuda::attention_forward(f, nullptr), bt::Error);
}

TEST(CudaAttention, RejectsKeyValueHeadsNotDividingQueryHeads) {
  BT_SKIP_WITHOUT_GPU();
  DevBuf d(1 << 16);
  AttnForward f;
  f.shape = {1, 4, 4, 64, 3};
  f.sq = f.so = kernels::contiguous_bhtd(f.shape);
  f.sk = f.sv = kernels::contiguous_kv_bhtd(f.shape);
  f.q = f.k = f.v = d.get();
  f.o = d.get();
  EXPECT_THROW(cuda::attention_forward(f, nullptr), bt::Error);
}

}  // namespace
}  // namespace bt::test::gpu
