// GPU causal attention forward/backward against the CPU kernels: T not a
// multiple of the tiles, several head dims, contiguous and fused-QKV strides.
#include <cmath>
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
using kernels::AttnShape;
using kernels::AttnStrides;

struct Case {
  int64_t B, H, T, D;
  bool fused;  // q/k/v (and their grads) are slices of one [B, T, 3, H, D] buffer
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
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
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

}  // namespace
}  // namespace bt::test::gpu
