// Causal attention forward/backward against a naive full-matrix double
// reference, on contiguous and fused-QKV strided layouts, with H query heads
// and Hkv key/value heads (grouped-query attention: Hkv divides H).
#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/attention.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace bt::test {
namespace {
using kernels::AttnBackward;
using kernels::AttnForward;
using kernels::AttnShape;
using kernels::AttnStrides;
namespace cpu = kernels::cpu;

int64_t at(const AttnStrides& s, int64_t b, int64_t h, int64_t t, int64_t d) {
  return b * s.b + h * s.h + t * s.t + d;
}

struct RefOut {
  std::vector<double> o, lse, dq, dk, dv;  // packed [B, H, T, D] / [B, H, T]; dk, dv [B, Hkv, T, D]
};

/// Naive reference: full S, masked softmax, O = P V; dP = dO V^T,
/// dS = P * (dP - rowsum(P * dP)), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO.
/// Query head h uses key/value head h / (H / Hkv); dK and dV of a key/value
/// head sum the contributions of its query heads.
/// With o_given (packed [B, H, T, D]) the row term is instead sum_d dO * o_given,
/// as the kernel contract specifies (it matters when O was rounded to bf16).
RefOut reference(const AttnShape& sh, double scale, const std::vector<double>& q, AttnStrides sq,
                 const std::vector<double>& k, AttnStrides sk, const std::vector<double>& v, AttnStrides sv,
                 const std::vector<double>& dout, AttnStrides sdo,
                 const std::vector<double>* o_given = nullptr) {
  const int64_t B = sh.B, H = sh.H, T = sh.T, D = sh.D, Hkv = sh.kv_heads(), G = H / Hkv;
  RefOut r;
  r.o.assign(B * H * T * D, 0), r.lse.assign(B * H * T, 0);
  r.dq.assign(B * H * T * D, 0), r.dk.assign(B * Hkv * T * D, 0), r.dv.assign(B * Hkv * T * D, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> P(T * T, 0.0), dP(T * T, 0.0);
      const int64_t base = (b * H + h) * T, hk = h / G, kbase = (b * Hkv + hk) * T;
      for (int64_t i = 0; i < T; ++i) {
        double mx = -INFINITY;
        std::vector<double> s(T);
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += q[at(sq, b, h, i, d)] * k[at(sk, b, hk, j, d)];
          s[j] = scale * acc;
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (int64_t j = 0; j <= i; ++j) z += std::exp(s[j] - mx);
        r.lse[base + i] = mx + std::log(z);
        for (int64_t j = 0; j <= i; ++j) P[i * T + j] = std::exp(s[j] - mx) / z;
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += P[i * T + j] * v[at(sv, b, hk, j, d)];
          r.o[(base + i) * D + d] = acc;
        }
      }
      for (int64_t i = 0; i < T; ++i) {
        double rs = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += dout[at(sdo, b, h, i, d)] * v[at(sv, b, hk, j, d)];
          dP[i * T + j] = acc;
          rs += P[i * T + j] * acc;
        }
        if (o_given) {
          rs = 0;
          for (int64_t d = 0; d < D; ++d) rs += dout[at(sdo, b, h, i, d)] * (*o_given)[(base + i) * D + d];
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = P[i * T + j] * (dP[i * T + j] - rs);
          for (int64_t d = 0; d < D; ++d) {
            r.dq[(base + i) * D + d] += scale * ds * k[at(sk, b, hk, j, d)];
            r.dk[(kbase + j) * D + d] += scale * ds * q[at(sq, b, h, i, d)];
            r.dv[(kbase + j) * D + d] += P[i * T + j] * dout[at(sdo, b, h, i, d)];
          }
        }
      }
    }
  return r;
}

/// Reads a strided [B, H, T, D] view into a packed vector.
std::vector<double> pack(const Buf& buf, const AttnShape& sh, AttnStrides s) {
  std::vector<double> out;
  for (int64_t b = 0; b < sh.B; ++b)
    for (int64_t h = 0; h < sh.H; ++h)
      for (int64_t t = 0; t < sh.T; ++t)
        for (int64_t d = 0; d < sh.D; ++d) out.push_back(buf.get(at(s, b, h, t, d)));
  return out;
}

void run_case(DType dt, const AttnShape& sh, float scale, bool fused, uint32_t seed) {
  SCOPED_TRACE(bt::cat(dtype_name(dt), " B=", sh.B, " H=", sh.H, " Hkv=", sh.kv_heads(), " T=", sh.T,
                       " D=", sh.D, " fused=", fused));
  const int64_t B = sh.B, H = sh.H, Hkv = sh.kv_heads(), T = sh.T, D = sh.D;
  const int64_t n = B * H * T * D, nkv = B * Hkv * T * D;
  // fused: q, k, v are slices of one [B, T, H + 2 Hkv, D] buffer (q heads, then
  // k heads, then v heads: a fused projection); o, dout are [B, T, H, D].
  const int64_t row = (H + 2 * Hkv) * D;
  const AttnStrides sq = fused ? AttnStrides{T * row, D, row} : kernels::contiguous_bhtd(sh);
  const AttnStrides skv = fused ? sq : kernels::contiguous_kv_bhtd(sh);
  const AttnStrides so = fused ? AttnStrides{T * H * D, D, H * D} : kernels::contiguous_bhtd(sh);
  const int64_t koff = fused ? H * D : 0, voff = fused ? (H + Hkv) * D : 0;
  Buf qkv = rand_buf(dt, fused ? B * T * row : n, seed), kb = rand_buf(dt, nkv, seed + 1),
      vb = rand_buf(dt, nkv, seed + 2);
  Buf o(dt, n), dout = rand_buf(dt, n, seed + 3);
  const unsigned char* base = static_cast<const unsigned char*>(qkv.data());
  const size_t es = dtype_size(dt);
  const void* qp = base;
  const void* kp = fused ? static_cast<const void*>(base + koff * es) : kb.data();
  const void* vp = fused ? static_cast<const void*>(base + voff * es) : vb.data();
  std::vector<float> lse(B * H * T, NAN);

  AttnForward f;
  f.dt = dt, f.shape = sh, f.scale = scale;
  f.q = qp, f.sq = sq, f.k = kp, f.sk = skv, f.v = vp, f.sv = skv, f.o = o.data(), f.so = so,
  f.lse = lse.data();
  cpu::attention_forward(f);

  // Exact inputs as doubles, addressed through the same strides.
  const std::vector<double> all = qkv.vals();
  std::vector<double> qv = all, kv = fused ? std::vector<double>(all.begin() + koff, all.end()) : kb.vals(),
                      vv = fused ? std::vector<double>(all.begin() + voff, all.end()) : vb.vals();
  const RefOut ref = reference(sh, scale, qv, sq, kv, skv, vv, skv, dout.vals(), so);
  // For BF16 the backward's row term uses the bf16-rounded O it is given.
  const std::vector<double> o_stored = pack(o, sh, so);
  const RefOut gref =
      dt == DType::BF16 ? reference(sh, scale, qv, sq, kv, skv, vv, skv, dout.vals(), so, &o_stored) : ref;
  EXPECT_LT(rel_err(pack(o, sh, so), ref.o), tol(dt));
  EXPECT_LT(rel_err(std::vector<double>(lse.begin(), lse.end()), ref.lse), 1e-6);

  // Backward into one fused gradient buffer (or three), pre-filled with NaN:
  // every element must be written.
  Buf dqkv(dt, fused ? B * T * row : n), dkb(dt, nkv), dvb(dt, nkv);
  for (Buf* bptr : {&dqkv, &dkb, &dvb})
    for (int64_t i = 0; i < bptr->n; ++i) bptr->set(i, NAN);
  unsigned char* gbase = static_cast<unsigned char*>(dqkv.data());
  AttnBackward g;
  g.dt = dt, g.shape = sh, g.scale = scale;
  g.q = qp, g.sq = sq, g.k = kp, g.sk = skv, g.v = vp, g.sv = skv, g.o = o.data(), g.so = so;
  g.dout = dout.data(), g.sdo = so, g.lse = lse.data();
  g.dq = gbase, g.sdq = sq;
  g.dk = fused ? static_cast<void*>(gbase + koff * es) : dkb.data(), g.sdk = skv;
  g.dv = fused ? static_cast<void*>(gbase + voff * es) : dvb.data(), g.sdv = skv;
  cpu::attention_backward(g);
  const Buf& dkbuf = fused ? dqkv : dkb;
  const Buf& dvbuf = fused ? dqkv : dvb;
  auto pack_off = [&](const Buf& b, int64_t off, int64_t heads, const AttnStrides& st) {
    std::vector<double> out;
    for (int64_t bb = 0; bb < B; ++bb)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t d = 0; d < D; ++d) out.push_back(b.get(off + at(st, bb, h, t, d)));
    return out;
  };
  EXPECT_LT(rel_err(pack_off(dqkv, 0, H, sq), gref.dq), tol(dt)) << "dq";
  EXPECT_LT(rel_err(pack_off(dkbuf, koff, Hkv, skv), gref.dk), tol(dt)) << "dk";
  EXPECT_LT(rel_err(pack_off(dvbuf, voff, Hkv, skv), gref.dv), tol(dt)) << "dv";
  for (const Buf* bptr : std::initializer_list<const Buf*>{&dqkv, &dkbuf, &dvbuf})
    for (int64_t i = 0; i < bptr->n; ++i)
      ASSERT_FALSE(std::isnan(bptr->get(i))) << "gradient element " << i << " not written";
}

TEST(AttentionCpu, ForwardBackwardContiguous) {
  const AttnShape shapes[] = {{1, 1, 1, 1}, {1, 1, 3, 5}, {2, 3, 17, 8}, {1, 2, 33, 16}, {1, 1, 64, 3}};
  uint32_t seed = 1;
  for (DType dt : kFloatTypes)
    for (const AttnShape& s : shapes) {
      run_case(dt, s, 1.0f / std::sqrt(static_cast<float>(s.D)), false, seed += 4);
      run_case(dt, s, 0.3f, false, seed += 4);
    }
}

TEST(AttentionCpu, ForwardBackwardFusedQkvStrides) {
  const AttnShape shapes[] = {{1, 1, 5, 4}, {2, 3, 17, 8}, {2, 2, 33, 5}};
  uint32_t seed = 100;
  for (DType dt : kFloatTypes)
    for (const AttnShape& s : shapes)
      run_case(dt, s, 1.0f / std::sqrt(static_cast<float>(s.D)), true, seed += 4);
}

TEST(AttentionCpu, GroupedQueryHeads) {
  // H = 4 query heads over Hkv = 2 (groups of 2) and 1 (multi-query); 6 over 3.
  const AttnShape shapes[] = {{2, 4, 17, 8, 2}, {1, 4, 33, 5, 1}, {1, 6, 9, 4, 3}};
  uint32_t seed = 200;
  for (DType dt : kFloatTypes)
    for (const AttnShape& s : shapes)
      for (bool fused : {false, true})
        run_case(dt, s, 1.0f / std::sqrt(static_cast<float>(s.D)), fused, seed += 4);
}

TEST(AttentionCpu, LargeScoresAreStable) {
  // Scores of several hundred would overflow exp without max subtraction.
  for (DType dt : kFloatTypes) run_case(dt, AttnShape{1, 2, 17, 8}, 40.0f, false, 77);
}

/// The F64 backward against central finite differences of sum(dout * o), for
/// every element of q, k and v.
void check_f64_finite_differences(const AttnShape& sh) {
  SCOPED_TRACE(bt::cat("B=", sh.B, " H=", sh.H, " Hkv=", sh.kv_heads(), " T=", sh.T, " D=", sh.D));
  const int64_t n = sh.B * sh.H * sh.T * sh.D, nkv = sh.B * sh.kv_heads() * sh.T * sh.D;
  const AttnStrides s = kernels::contiguous_bhtd(sh), skv = kernels::contiguous_kv_bhtd(sh);
  std::vector<double> q = randn(n, 1), k = randn(nkv, 2), v = randn(nkv, 3), dout = randn(n, 4);
  const float scale = 0.7f;
  auto loss = [&](const std::vector<double>& qq, const std::vector<double>& kk,
                  const std::vector<double>& vv) {
    std::vector<double> o(n);
    std::vector<float> lse(sh.B * sh.H * sh.T);
    AttnForward f;
    f.dt = DType::F64, f.shape = sh, f.scale = scale;
    f.q = qq.data(), f.k = kk.data(), f.v = vv.data(), f.o = o.data(), f.sq = f.so = s, f.sk = f.sv = skv;
    f.lse = lse.data();
    cpu::attention_forward(f);
    double l = 0;
    for (int64_t i = 0; i < n; ++i) l += dout[i] * o[i];
    return std::make_pair(l, std::make_pair(o, lse));
  };
  auto [l0, fw] = loss(q, k, v);
  std::vector<double> dq(n), dk(nkv), dv(nkv);
  AttnBackward g;
  g.dt = DType::F64, g.shape = sh, g.scale = scale;
  g.q = q.data(), g.k = k.data(), g.v = v.data(), g.o = fw.first.data(), g.dout = dout.data(),
  g.lse = fw.second.data();
  g.dq = dq.data(), g.dk = dk.data(), g.dv = dv.data();
  g.sq = g.so = g.sdo = g.sdq = s;
  g.sk = g.sv = g.sdk = g.sdv = skv;
  cpu::attention_backward(g);
  const double h = 1e-6;
  auto numeric = [&](int which, int64_t count) {
    std::vector<double> out;
    for (int64_t i = 0; i < count; ++i) {
      auto qp = q, kp = k, vp = v, qm = q, km = k, vm = v;
      (which == 0 ? qp : which == 1 ? kp : vp)[i] += h;
      (which == 0 ? qm : which == 1 ? km : vm)[i] -= h;
      out.push_back((loss(qp, kp, vp).first - loss(qm, km, vm).first) / (2 * h));
    }
    return out;
  };
  EXPECT_LT(rel_err(dq, numeric(0, n)), 1e-7);
  EXPECT_LT(rel_err(dk, numeric(1, nkv)), 1e-7);
  EXPECT_LT(rel_err(dv, numeric(2, nkv)), 1e-7);
}

TEST(AttentionCpu, F64BackwardMatchesFiniteDifferences) { check_f64_finite_differences({1, 2, 5, 3}); }

TEST(AttentionCpu, F64GroupedQueryBackwardMatchesFiniteDifferences) {
  check_f64_finite_differences({1, 4, 5, 3, 2});  // groups of 2 query heads
  check_f64_finite_differences({2, 4, 4, 3, 1});  // one key/value head for all 4
}

/// Grouped-query attention equals multi-head attention on K and V with each
/// key/value head repeated G times: the same forward bits, the same dq bits
/// (each query head does the same arithmetic), and dk, dv equal to the sums of
/// the repeated heads' gradients (to rounding: the sums run in another order).
void check_equals_repeated_heads(DType dt, const AttnShape& gqa) {
  SCOPED_TRACE(bt::cat(dtype_name(dt), " H=", gqa.H, " Hkv=", gqa.Hkv));
  AttnShape mha = gqa;
  mha.Hkv = 0;
  const int64_t B = gqa.B, H = gqa.H, Hkv = gqa.Hkv, G = gqa.group(), T = gqa.T, D = gqa.D;
  const int64_t n = B * H * T * D, nkv = B * Hkv * T * D;
  const Buf q = rand_buf(dt, n, 11), k = rand_buf(dt, nkv, 12), v = rand_buf(dt, nkv, 13),
            dout = rand_buf(dt, n, 14);
  Buf k_rep(dt, n), v_rep(dt, n);  // [B, H, T, D]: head h holds key/value head h / G
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T * D; ++i) {
        k_rep.set((b * H + h) * T * D + i, k.get((b * Hkv + h / G) * T * D + i));
        v_rep.set((b * H + h) * T * D + i, v.get((b * Hkv + h / G) * T * D + i));
      }
  struct Out {
    Buf o, dq, dk, dv;
    std::vector<float> lse;
  };
  auto run = [&](const AttnShape& sh, const Buf& kk, const Buf& vv) {
    const int64_t nk = sh.B * sh.kv_heads() * T * D;
    Out r{Buf(dt, n), Buf(dt, n), Buf(dt, nk), Buf(dt, nk), std::vector<float>(B * H * T)};
    const AttnStrides s = kernels::contiguous_bhtd(sh), skv = kernels::contiguous_kv_bhtd(sh);
    AttnForward f;
    f.dt = dt, f.shape = sh, f.scale = 0.4f;
    f.q = q.data(), f.k = kk.data(), f.v = vv.data(), f.o = r.o.data(), f.lse = r.lse.data();
    f.sq = f.so = s, f.sk = f.sv = skv;
    cpu::attention_forward(f);
    AttnBackward g;
    g.dt = dt, g.shape = sh, g.scale = f.scale;
    g.q = q.data(), g.k = kk.data(), g.v = vv.data(), g.o = r.o.data(), g.dout = dout.data();
    g.lse = r.lse.data(), g.dq = r.dq.data(), g.dk = r.dk.data(), g.dv = r.dv.data();
    g.sq = g.so = g.sdo = g.sdq = s;
    g.sk = g.sv = g.sdk = g.sdv = skv;
    cpu::attention_backward(g);
    return r;
  };
  const Out got = run(gqa, k, v), want = run(mha, k_rep, v_rep);
  EXPECT_EQ(got.o.vals(), want.o.vals()) << "o";
  EXPECT_EQ(got.lse, want.lse) << "lse";
  EXPECT_EQ(got.dq.vals(), want.dq.vals()) << "dq";
  std::vector<double> dk_sum(nkv, 0.0), dv_sum(nkv, 0.0);
  const std::vector<double> dk_rep = want.dk.vals(), dv_rep = want.dv.vals();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T * D; ++i) {
        dk_sum[(b * Hkv + h / G) * T * D + i] += dk_rep[(b * H + h) * T * D + i];
        dv_sum[(b * Hkv + h / G) * T * D + i] += dv_rep[(b * H + h) * T * D + i];
      }
  const double eps = dt == DType::F64 ? 1e-13 : 1e-6;
  EXPECT_LT(rel_err(got.dk.vals(), dk_sum), eps) << "dk";
  EXPECT_LT(rel_err(got.dv.vals(), dv_sum), eps) << "dv";
}

TEST(AttentionCpu, GroupedQueryEqualsRepeatedKeyValueHeads) {
  for (DType dt : {DType::F32, DType::F64}) {
    check_equals_repeated_heads(dt, {2, 4, 19, 8, 2});
    check_equals_repeated_heads(dt, {1, 4, 19, 8, 1});
  }
}

TEST(AttentionCpu, Errors) {
  std::vector<int32_t> buf(64);
  std::vector<float> lse(8);
  AttnForward f;
  f.dt = DType::F16;
  f.shape = {1, 1, 2, 2};
  f.q = f.k = f.v = buf.data(), f.o = buf.data(), f.lse = lse.data();
  f.sq = f.sk = f.sv = f.so = kernels::contiguous_bhtd(f.shape);
  expect_error([&] { cpu::attention_forward(f); }, "attention_forward: unsupported dtype f16");
  AttnBackward g;
  g.dt = DType::F32;
  g.shape = {1, 1, 2, 2};
  expect_error([&] { cpu::attention_backward(g); }, "lse");
  g.shape = {1, -1, 2, 2};
  expect_error([&] { cpu::attention_backward(g); }, "negative shape");
  f.dt = DType::F32;
  f.shape = {1, 4, 2, 2, 3};
  expect_error([&] { cpu::attention_forward(f); },
               "attention_forward: the 3 key/value heads (Hkv) must divide the 4 query heads (H)");
  f.shape.Hkv = -1;
  expect_error([&] { cpu::attention_forward(f); }, "negative shape");
}

}  // namespace
}  // namespace bt::test
