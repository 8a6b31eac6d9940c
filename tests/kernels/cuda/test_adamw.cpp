// GPU fused AdamW against the CPU kernel: f32/bf16 gradients, optional f32/bf16
// param copy, odd sizes (vector body + scalar tail) and unaligned buffers.
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

}  // namespace
}  // namespace bt::test::gpu
