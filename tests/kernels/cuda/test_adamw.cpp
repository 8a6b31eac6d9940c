// GPU fused AdamW against the CPU kernel: f32/bf16 gradients, optional f32/bf16
// param copy, odd sizes (vector body + scalar tail) and unaligned buffers; and
// adamw_many (many buffers a launch) against adamw one buffer at a time.
#include <iterator>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/adamw.h"
#include "tests/kernels/cuda/gpu_test_util.h"

namespace bt::test::gpu {
namespace {
namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;
using kernels::AdamWArgs;

std::vector<float> floats(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

TEST(CudaAdamW, MatchesCpu) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  for (DType gdt : {DType::F32, DType::BF16}) {
    for (int copy_mode = 0; copy_mode < 3; ++copy_mode) {  // none, f32, bf16
      for (int64_t n : {1, 7, 1000, 4099, 100003}) {
        for (int64_t off : {0, 1}) {
          SCOPED_TRACE(::testing::Message() << "grad " << dtype_name(gdt) << " copy " << copy_mode << " n "
                                            << n << " offset " << off);
          const DType cdt = copy_mode == 2 ? DType::BF16 : DType::F32;
          const int64_t tot = n + off;
          std::vector<float> p = floats(normal_vals(tot, gen)), m = floats(normal_vals(tot, gen, 0.01));
          std::vector<float> v = floats(uniform_vals(tot, gen, 0.0, 1e-3));
          const HostBuf g = randn_buf(gdt, tot, gen, 0.1);
          AdamWArgs a;
          a.n = n;
          a.lr = 3e-4f, a.beta1 = 0.9f, a.beta2 = 0.95f, a.eps = 1e-8f, a.weight_decay = 0.1f;
          a.bias1 = 1.0f - 0.9f * 0.9f * 0.9f, a.bias2 = 1.0f - 0.95f * 0.95f * 0.95f, a.grad_scale = 0.5f;
          a.grad_dt = gdt;
          a.copy_dt = cdt;
          // CPU
          std::vector<float> p_ref = p, m_ref = m, v_ref = v;
          HostBuf copy_ref(cdt, tot);
          AdamWArgs ac = a;
          ac.param = p_ref.data() + off, ac.m = m_ref.data() + off, ac.v = v_ref.data() + off;
          ac.grad = static_cast<const unsigned char*>(g.data()) + off * dtype_size(gdt);
          ac.param_copy =
              copy_mode ? static_cast<unsigned char*>(copy_ref.data()) + off * dtype_size(cdt) : nullptr;
          cpu::adamw(ac);
          // GPU
          DevBuf dp(upload_vector(p)), dm(upload_vector(m)), dv(upload_vector(v)), dg(g);
          DevBuf dc(static_cast<size_t>(tot) * dtype_size(cdt));
          dc.poison();
          AdamWArgs ag = a;
          ag.param = dp.as<float>() + off, ag.m = dm.as<float>() + off, ag.v = dv.as<float>() + off;
          ag.grad = dg.as<unsigned char>() + off * dtype_size(gdt);
          ag.param_copy = copy_mode ? dc.as<unsigned char>() + off * dtype_size(cdt) : nullptr;
          cuda::adamw(ag, nullptr);
          BT_EXPECT_REL(to_doubles(dp.to_vector<float>(tot)), to_doubles(p_ref), 1e-5, "param");
          BT_EXPECT_REL(to_doubles(dm.to_vector<float>(tot)), to_doubles(m_ref), 1e-5, "m");
          BT_EXPECT_REL(to_doubles(dv.to_vector<float>(tot)), to_doubles(v_ref), 1e-5, "v");
          if (copy_mode) {
            const std::vector<double> all = dc.to_host(cdt, tot).vals(), ref_all = copy_ref.vals();
            BT_EXPECT_REL(std::vector<double>(all.begin() + off, all.end()),
                          std::vector<double>(ref_all.begin() + off, ref_all.end()), tol(cdt), "param copy");
          }
        }
      }
    }
  }
}

// Note [One AdamW launch]: 45 buffers -- more than one launch's table holds
// -- of sizes around the chunk (16384) and the 4-element packs, gradients in
// f32 and bf16, copies none, f32 and bf16, two weight decays, and every
// seventh buffer one element off alignment (the one-by-one fallback):
// adamw_many gives the bits adamw gives buffer by buffer, with the scalars
// read from device memory as a captured step reads them.
TEST(CudaAdamW, ManyBuffersInFewLaunchesGiveTheBitsOfOneAtATime) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  const int64_t sizes[] = {1, 3, 4, 5, 768, 2304, 16383, 16384, 16385, 40000, 100003};
  std::vector<AdamWArgs> args;
  std::vector<std::vector<float>> p0, m0, v0;
  std::vector<HostBuf> grads;
  for (int i = 0; i < 45; ++i) {
    AdamWArgs a;
    a.n = sizes[static_cast<size_t>(i) % std::size(sizes)];
    a.grad_dt = i % 2 ? DType::BF16 : DType::F32;
    a.copy_dt = i % 3 == 2 ? DType::BF16 : DType::F32;
    a.beta1 = 0.9f, a.beta2 = 0.95f, a.eps = 1e-8f, a.weight_decay = i % 4 ? 0.1f : 0.0f;
    args.push_back(a);
    const int64_t tot = a.n + 1;
    p0.push_back(floats(normal_vals(tot, gen)));
    m0.push_back(floats(normal_vals(tot, gen, 0.01)));
    v0.push_back(floats(uniform_vals(tot, gen, 0.0, 1e-3)));
    grads.push_back(randn_buf(a.grad_dt, tot, gen, 0.1));
  }
  const std::vector<float> hyper = {3e-4f, 1.0f - 0.9f * 0.9f, 1.0f - 0.95f * 0.95f}, scale = {0.5f};
  DevBuf dh(upload_vector(hyper)), ds(upload_vector(scale));
  struct Run {
    std::vector<DevBuf> p, m, v, g, c;
  };
  // Fresh buffers from the same values; each buffer's own allocation (256-byte aligned), offset by one
  // element for every seventh.
  auto prepare = [&](Run& r, std::vector<AdamWArgs>& out) {
    out = args;
    for (size_t i = 0; i < args.size(); ++i) {
      const int64_t off = i % 7 == 6 ? 1 : 0, tot = args[i].n + 1;
      r.p.emplace_back(upload_vector(p0[i]));
      r.m.emplace_back(upload_vector(m0[i]));
      r.v.emplace_back(upload_vector(v0[i]));
      r.g.emplace_back(grads[i]);
      r.c.emplace_back(static_cast<size_t>(tot) * dtype_size(args[i].copy_dt));
      r.c.back().poison();
      AdamWArgs& a = out[i];
      a.param = r.p.back().as<float>() + off, a.m = r.m.back().as<float>() + off,
      a.v = r.v.back().as<float>() + off;
      a.grad = r.g.back().as<unsigned char>() + off * dtype_size(a.grad_dt);
      a.param_copy = i % 3 ? r.c.back().as<unsigned char>() + off * dtype_size(a.copy_dt) : nullptr;
      a.hyper = dh.as<float>(), a.scale = ds.as<float>();
    }
  };
  Run one, many, bare;
  std::vector<AdamWArgs> a1, a2, a3;
  prepare(one, a1);
  prepare(many, a2);
  prepare(bare, a3);
  for (AdamWArgs& a : a3) a.param_copy = nullptr;  // writing a copy changes nothing else
  for (const AdamWArgs& a : a1) cuda::adamw(a, nullptr);
  cuda::adamw_many(a2, nullptr);
  cuda::adamw_many(a3, nullptr);
  for (size_t i = 0; i < args.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "buffer " << i << " n " << args[i].n);
    const int64_t tot = args[i].n + 1;
    EXPECT_EQ(many.p[i].to_vector<float>(tot), one.p[i].to_vector<float>(tot));
    EXPECT_EQ(many.m[i].to_vector<float>(tot), one.m[i].to_vector<float>(tot));
    EXPECT_EQ(many.v[i].to_vector<float>(tot), one.v[i].to_vector<float>(tot));
    EXPECT_NE(many.p[i].to_vector<float>(tot), p0[i]) << "updated";
    EXPECT_EQ(bare.p[i].to_vector<float>(tot), many.p[i].to_vector<float>(tot)) << "without the copy";
    EXPECT_EQ(bare.v[i].to_vector<float>(tot), many.v[i].to_vector<float>(tot)) << "without the copy";
    const size_t cb = static_cast<size_t>(tot) * dtype_size(args[i].copy_dt);
    std::vector<unsigned char> c1(cb), c2(cb);
    one.c[i].download(c1.data(), cb);
    many.c[i].download(c2.data(), cb);
    EXPECT_EQ(c2, c1) << "the copy, bytes (poisoned where not written)";
  }
}

}  // namespace
}  // namespace bt::test::gpu
