// Causal attention forward/backward against a naive full-matrix double
// reference, on contiguous and fused-QKV strided layouts.
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
  std::vector<double> o, lse, dq, dk, dv;  // packed [B, H, T, D] / [B, H, T]
};

/// Naive reference: full S, masked softmax, O = P V; dP = dO V^T,
/// dS = P * (dP - rowsum(P * dP)), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO.
/// With o_given (packed [B, H, T, D]) the row term is instead sum_d dO * o_given,
/// as the kernel contract specifies (it matters when O was rounded to bf16).
RefOut reference(const AttnShape& sh, double scale, const std::vector<double>& q, AttnStrides sq,
                 const std::vector<double>& k, AttnStrides sk, const std::vector<double>& v, AttnStrides sv,
                 const std::vector<double>& dout, AttnStrides sdo,
                 const std::vector<double>* o_given = nullptr) {
  const int64_t B = sh.B, H = sh.H, T = sh.T, D = sh.D;
  RefOut r;
  r.o.assign(B * H * T * D, 0), r.lse.assign(B * H * T, 0);
  r.dq.assign(B * H * T * D, 0), r.dk.assign(B * H * T * D, 0), r.dv.assign(B * H * T * D, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> P(T * T, 0.0), dP(T * T, 0.0);
      const int64_t base = (b * H + h) * T;
      for (int64_t i = 0; i < T; ++i) {
        double mx = -INFINITY;
        std::vector<double> s(T);
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += q[at(sq, b, h, i, d)] * k[at(sk, b, h, j, d)];
          s[j] = scale * acc;
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (int64_t j = 0; j <= i; ++j) z += std::exp(s[j] - mx);
        r.lse[base + i] = mx + std::log(z);
        for (int64_t j = 0; j <= i; ++j) P[i * T + j] = std::exp(s[j] - mx) / z;
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += P[i * T + j] * v[at(sv, b, h, j, d)];
          r.o[(base + i) * D + d] = acc;
        }
      }
      for (int64_t i = 0; i < T; ++i) {
        double rs = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += dout[at(sdo, b, h, i, d)] * v[at(sv, b, h, j, d)];
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
            r.dq[(base + i) * D + d] += scale * ds * k[at(sk, b, h, j, d)];
            r.dk[(base + j) * D + d] += scale * ds * q[at(sq, b, h, i, d)];
            r.dv[(base + j) * D + d] += P[i * T + j] * dout[at(sdo, b, h, i, d)];
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
  SCOPED_TRACE(bt::cat(dtype_name(dt), " B=", sh.B, " H=", sh.H, " T=", sh.T, " D=", sh.D, " fused=", fused));
  const int64_t B = sh.B, H = sh.H, T = sh.T, D = sh.D, n = B * H * T * D;
  // fused: q, k, v are slices of one [B, T, 3, H, D] buffer; o, dout are [B, T, H, D].
  const AttnStrides sqkv = fused ? AttnStrides{T * 3 * H * D, D, 3 * H * D} : kernels::contiguous_bhtd(sh);
  const AttnStrides so = fused ? AttnStrides{T * H * D, D, H * D} : kernels::contiguous_bhtd(sh);
  const int64_t koff = fused ? H * D : 0, voff = fused ? 2 * H * D : 0;
  Buf qkv = rand_buf(dt, fused ? 3 * n : n, seed), kb = rand_buf(dt, n, seed + 1),
      vb = rand_buf(dt, n, seed + 2);
  Buf o(dt, n), dout = rand_buf(dt, n, seed + 3);
  const unsigned char* base = static_cast<const unsigned char*>(qkv.data());
  const size_t es = dtype_size(dt);
  const void* qp = base;
  const void* kp = fused ? static_cast<const void*>(base + koff * es) : kb.data();
  const void* vp = fused ? static_cast<const void*>(base + voff * es) : vb.data();
  std::vector<float> lse(B * H * T, NAN);

  AttnForward f;
  f.dt = dt, f.shape = sh, f.scale = scale;
  f.q = qp, f.sq = sqkv, f.k = kp, f.sk = sqkv, f.v = vp, f.sv = sqkv, f.o = o.data(), f.so = so,
  f.lse = lse.data();
  cpu::attention_forward(f);

  // Exact inputs as doubles, addressed through the same strides.
  const std::vector<double> all = qkv.vals();
  std::vector<double> qv = all, kv = fused ? std::vector<double>(all.begin() + koff, all.end()) : kb.vals(),
                      vv = fused ? std::vector<double>(all.begin() + voff, all.end()) : vb.vals();
  const RefOut ref = reference(sh, scale, qv, sqkv, kv, sqkv, vv, sqkv, dout.vals(), so);
  // For BF16 the backward's row term uses the bf16-rounded O it is given.
  const std::vector<double> o_stored = pack(o, sh, so);
  const RefOut gref = dt == DType::BF16
                          ? reference(sh, scale, qv, sqkv, kv, sqkv, vv, sqkv, dout.vals(), so, &o_stored)
                          : ref;
  EXPECT_LT(rel_err(pack(o, sh, so), ref.o), tol(dt));
  EXPECT_LT(rel_err(std::vector<double>(lse.begin(), lse.end()), ref.lse), 1e-6);

  // Backward into one fused gradient buffer (or three), pre-filled with NaN:
  // every element must be written.
  Buf dqkv(dt, fused ? 3 * n : n), dkb(dt, n), dvb(dt, n);
  for (Buf* bptr : {&dqkv, &dkb, &dvb})
    for (int64_t i = 0; i < bptr->n; ++i) bptr->set(i, NAN);
  unsigned char* gbase = static_cast<unsigned char*>(dqkv.data());
  AttnBackward g;
  g.dt = dt, g.shape = sh, g.scale = scale;
  g.q = qp, g.sq = sqkv, g.k = kp, g.sk = sqkv, g.v = vp, g.sv = sqkv, g.o = o.data(), g.so = so;
  g.dout = dout.data(), g.sdo = so, g.lse = lse.data();
  g.dq = gbase, g.sdq = sqkv;
  g.dk = fused ? static_cast<void*>(gbase + koff * es) : dkb.data(), g.sdk = sqkv;
  g.dv = fused ? static_cast<void*>(gbase + voff * es) : dvb.data(), g.sdv = sqkv;
  cpu::attention_backward(g);
  const Buf& dkbuf = fused ? dqkv : dkb;
  const Buf& dvbuf = fused ? dqkv : dvb;
  auto pack_off = [&](const Buf& b, int64_t off) {
    std::vector<double> out;
    for (int64_t bb = 0; bb < B; ++bb)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t d = 0; d < D; ++d) out.push_back(b.get(off + at(sqkv, bb, h, t, d)));
    return out;
  };
  EXPECT_LT(rel_err(pack_off(dqkv, 0), gref.dq), tol(dt)) << "dq";
  EXPECT_LT(rel_err(pack_off(dkbuf, fused ? koff : 0), gref.dk), tol(dt)) << "dk";
  EXPECT_LT(rel_err(pack_off(dvbuf, fused ? voff : 0), gref.dv), tol(dt)) << "dv";
  for (int64_t i = 0; i < dqkv.n; ++i)
    ASSERT_FALSE(std::isnan(dqkv.get(i))) << "gradient element " << i << " not written";
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

TEST(AttentionCpu, LargeScoresAreStable) {
  // Scores of several hundred would overflow exp without max subtraction.
  for (DType dt : kFloatTypes) run_case(dt, AttnShape{1, 2, 17, 8}, 40.0f, false, 77);
}

TEST(AttentionCpu, F64BackwardMatchesFiniteDifferences) {
  const AttnShape sh{1, 2, 5, 3};
  const int64_t n = sh.B * sh.H * sh.T * sh.D;
  const AttnStrides s = kernels::contiguous_bhtd(sh);
  std::vector<double> q = randn(n, 1), k = randn(n, 2), v = randn(n, 3), dout = randn(n, 4);
  const float scale = 0.7f;
  auto loss = [&](const std::vector<double>& qq, const std::vector<double>& kk,
                  const std::vector<double>& vv) {
    std::vector<double> o(n);
    std::vector<float> lse(sh.B * sh.H * sh.T);
    AttnForward f;
    f.dt = DType::F64, f.shape = sh, f.scale = scale;
    f.q = qq.data(), f.k = kk.data(), f.v = vv.data(), f.o = o.data(), f.sq = f.sk = f.sv = f.so = s;
    f.lse = lse.data();
    cpu::attention_forward(f);
    double l = 0;
    for (int64_t i = 0; i < n; ++i) l += dout[i] * o[i];
    return std::make_pair(l, std::make_pair(o, lse));
  };
  auto [l0, fw] = loss(q, k, v);
  std::vector<double> dq(n), dk(n), dv(n);
  AttnBackward g;
  g.dt = DType::F64, g.shape = sh, g.scale = scale;
  g.q = q.data(), g.k = k.data(), g.v = v.data(), g.o = fw.first.data(), g.dout = dout.data(),
  g.lse = fw.second.data();
  g.dq = dq.data(), g.dk = dk.data(), g.dv = dv.data();
  g.sq = g.sk = g.sv = g.so = g.sdo = g.sdq = g.sdk = g.sdv = s;
  cpu::attention_backward(g);
  const double h = 1e-6;
  std::vector<double> nq, nk, nv;
  for (int64_t i = 0; i < n; ++i) {
    auto num = [&](int which) {
      auto qp = q, kp = k, vp = v, qm = q, km = k, vm = v;
      (which == 0 ? qp : which == 1 ? kp : vp)[i] += h;
      (which == 0 ? qm : which == 1 ? km : vm)[i] -= h;
      return (loss(qp, kp, vp).first - loss(qm, km, vm).first) / (2 * h);
    };
    nq.push_back(num(0)), nk.push_back(num(1)), nv.push_back(num(2));
  }
  EXPECT_LT(rel_err(dq, nq), 1e-7);
  EXPECT_LT(rel_err(dk, nk), 1e-7);
  EXPECT_LT(rel_err(dv, nv), 1e-7);
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
}

}  // namespace
}  // namespace bt::test
