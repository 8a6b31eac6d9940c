// GPU LayerNorm forward/backward against the CPU kernels: vectorized and scalar
// paths (odd cols, unaligned pointers, long rows), with and without affine.
#include <vector>

#include <gtest/gtest.h>

#include "kernels/layernorm.h"
#include "tests/kernels/cuda/gpu_test_util.h"

namespace bt::test::gpu {
namespace {
namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

struct Case {
  int64_t rows, cols;
  bool affine = true;
  int64_t offset = 0;  // element offset of x/y/dy/dx inside their buffers (unaligned path)
};

std::vector<double> slice(const HostBuf& h, int64_t off, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = h.get(off + i);
  return v;
}

void run_case(DType dt, const Case& c, std::mt19937& gen) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " rows " << c.rows << " cols " << c.cols
                                    << " affine " << c.affine << " offset " << c.offset);
  const int64_t n = c.rows * c.cols, off = c.offset;
  const size_t es = dtype_size(dt);
  const float eps = 1e-5f;
  // A non-zero mean and scale, so that the centering matters.
  std::vector<double> xv = normal_vals(static_cast<size_t>(n + off), gen, 2.0);
  for (auto& x : xv) x += 0.5;
  const HostBuf x(dt, xv), w = random_buf(dt, c.cols, gen, 0.5, 1.5), b = random_buf(dt, c.cols, gen);
  const HostBuf dy = randn_buf(dt, n + off, gen);
  const unsigned char* xp = static_cast<const unsigned char*>(x.data()) + off * es;
  const unsigned char* dyp = static_cast<const unsigned char*>(dy.data()) + off * es;
  const void* wp = c.affine ? w.data() : nullptr;
  const void* bp = c.affine ? b.data() : nullptr;

  // ---- forward
  HostBuf y_ref(dt, n);
  std::vector<float> mean_ref(static_cast<size_t>(c.rows)), rstd_ref(static_cast<size_t>(c.rows));
  cpu::layernorm_forward(dt, xp, wp, bp, y_ref.data(), mean_ref.data(), rstd_ref.data(), c.rows, c.cols, eps);
  DevBuf dx_in(x), dw(w), db(b), dy_out(static_cast<size_t>(n + off) * es);
  DevBuf dmean(static_cast<size_t>(c.rows) * 4), drstd(static_cast<size_t>(c.rows) * 4);
  dy_out.poison();
  dmean.poison();
  drstd.poison();
  cuda::layernorm_forward(dt, dx_in.as<unsigned char>() + off * es, c.affine ? dw.get() : nullptr,
                          c.affine ? db.get() : nullptr, dy_out.as<unsigned char>() + off * es,
                          dmean.as<float>(), drstd.as<float>(), c.rows, c.cols, eps, nullptr);
  BT_EXPECT_REL(slice(dy_out.to_host(dt, n + off), off, n), y_ref.vals(), tol(dt), "y");
  BT_EXPECT_REL(to_doubles(dmean.to_vector<float>(static_cast<size_t>(c.rows))), to_doubles(mean_ref), 1e-5,
                "mean");
  BT_EXPECT_REL(to_doubles(drstd.to_vector<float>(static_cast<size_t>(c.rows))), to_doubles(rstd_ref), 1e-5,
                "rstd");

  // ---- backward (the CPU's mean/rstd on both sides)
  HostBuf dx_ref(dt, n), dw_ref(dt, c.cols), db_ref(dt, c.cols);
  cpu::layernorm_backward(dt, dyp, xp, wp, mean_ref.data(), rstd_ref.data(), dx_ref.data(),
                          c.affine ? dw_ref.data() : nullptr, c.affine ? db_ref.data() : nullptr, c.rows,
                          c.cols);
  DevBuf ddy(dy), dmean2(upload_vector(mean_ref)), drstd2(upload_vector(rstd_ref));
  DevBuf ddx(static_cast<size_t>(n + off) * es), ddw(static_cast<size_t>(c.cols) * es),
      ddb(static_cast<size_t>(c.cols) * es);
  DevBuf scratch(cuda::layernorm_backward_scratch_floats(c.rows, c.cols) * sizeof(float));
  ddx.poison();
  ddw.poison();
  ddb.poison();
  scratch.poison();
  for (int rep = 0; rep < 2; ++rep) {  // twice: dw/db are written, not accumulated
    cuda::layernorm_backward(dt, ddy.as<unsigned char>() + off * es, dx_in.as<unsigned char>() + off * es,
                             c.affine ? dw.get() : nullptr, dmean2.as<float>(), drstd2.as<float>(),
                             ddx.as<unsigned char>() + off * es, c.affine ? ddw.get() : nullptr,
                             c.affine ? ddb.get() : nullptr, c.rows, c.cols, scratch.as<float>(), nullptr);
  }
  BT_EXPECT_REL(slice(ddx.to_host(dt, n + off), off, n), dx_ref.vals(), tol(dt), "dx");
  if (c.affine) {
    BT_EXPECT_REL(ddw.to_host(dt, c.cols).vals(), dw_ref.vals(), tol(dt), "dw");
    BT_EXPECT_REL(ddb.to_host(dt, c.cols).vals(), db_ref.vals(), tol(dt), "db");
  }
}

TEST(CudaLayerNorm, MatchesCpu) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int64_t rows : {1, 7, 129, 1000})
      for (int64_t cols : {1, 31, 768, 1023, 1024}) run_case(dt, {rows, cols}, gen);
    run_case(dt, {129, 768, false}, gen);    // no affine
    run_case(dt, {33, 768, true, 1}, gen);   // unaligned -> scalar path
    run_case(dt, {17, 2048, true}, gen);     // long rows (fast path, K = 16 f32 / 8 bf16)
    run_case(dt, {9, 4096, true}, gen);      // beyond the f32 fast path
    run_case(dt, {5, 3000, true}, gen);      // long odd rows, scalar path
    run_case(dt, {2500, 64, true}, gen);     // rows > partial-sum warps (2048)
    run_case(dt, {4100, 40, true, 1}, gen);  // ... on the scalar path too
  }
}

}  // namespace
}  // namespace bt::test::gpu
