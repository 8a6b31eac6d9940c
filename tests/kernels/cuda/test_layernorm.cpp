// GPU LayerNorm forward/backward against the CPU kernels: vectorized and scalar
// paths (odd cols, unaligned pointers, long rows), with and without affine,
// f32 parameters and gradients with bf16 activations, and the residual add
// with its gradient (Note [Residual into LayerNorm]): the sum against the
// CPU's bits, y against the GPU's own plain forward of that sum bit for bit.
#include <cmath>
#include <cstring>
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
  int64_t offset = 0;       // element offset of x/y/dy/dx (and s) inside their buffers (unaligned path)
  bool f32_params = false;  // bf16 activations with f32 w/b and f32 dw/db
  int64_t res_rows = 0;     // > 0: add a residual of this many rows first, and a dres in backward
  bool res_bias =
      false;  // with the residual: a bias into it and dsum in backward (Note [A bias into the residual add])
};

std::vector<double> slice(const HostBuf& h, int64_t off, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = h.get(off + i);
  return v;
}

std::vector<unsigned char> bytes_of(const DevBuf& d, size_t from, size_t n) {
  std::vector<unsigned char> all(d.bytes());
  d.download(all.data(), all.size());
  return {all.begin() + static_cast<ptrdiff_t>(from), all.begin() + static_cast<ptrdiff_t>(from + n)};
}

void run_case(DType dt, const Case& c, std::mt19937& gen) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " rows " << c.rows << " cols " << c.cols
                                    << " affine " << c.affine << " offset " << c.offset << " f32 params "
                                    << c.f32_params << " residual rows " << c.res_rows << " residual bias "
                                    << c.res_bias);
  const int64_t n = c.rows * c.cols, off = c.offset;
  const size_t es = dtype_size(dt);
  const DType pdt = c.f32_params ? DType::F32 : dt;
  const kernels::LnTypes types{dt, pdt, pdt};
  const size_t ps = dtype_size(pdt);
  const float eps = 1e-5f;
  const bool res = c.res_rows > 0, rbias = res && c.res_bias;
  // A non-zero mean and scale, so that the centering matters.
  std::vector<double> xv = normal_vals(static_cast<size_t>(n + off), gen, 2.0);
  for (auto& x : xv) x += 0.5;
  const HostBuf x(dt, xv), w = random_buf(pdt, c.cols, gen, 0.5, 1.5), b = random_buf(pdt, c.cols, gen),
                           rb = random_buf(pdt, c.cols, gen);
  const HostBuf dy = randn_buf(dt, n + off, gen);
  const HostBuf r = randn_buf(dt, res ? c.res_rows * c.cols : 1, gen),
                dres = randn_buf(dt, res ? n + off : 1, gen, 2.0);
  const unsigned char* xp = static_cast<const unsigned char*>(x.data()) + off * es;
  const unsigned char* dyp = static_cast<const unsigned char*>(dy.data()) + off * es;
  const unsigned char* drp = static_cast<const unsigned char*>(dres.data()) + off * es;
  const void* wp = c.affine ? w.data() : nullptr;
  const void* bp = c.affine ? b.data() : nullptr;

  // ---- forward
  HostBuf y_ref(dt, n), s_ref(dt, n);
  std::vector<float> mean_ref(static_cast<size_t>(c.rows)), rstd_ref(static_cast<size_t>(c.rows));
  if (res)
    cpu::add_layernorm_forward(types, xp, r.data(), c.res_rows, wp, bp, s_ref.data(), y_ref.data(),
                               mean_ref.data(), rstd_ref.data(), c.rows, c.cols, eps,
                               rbias ? rb.data() : nullptr);
  else
    cpu::layernorm_forward(types, xp, wp, bp, y_ref.data(), mean_ref.data(), rstd_ref.data(), c.rows, c.cols,
                           eps);
  const size_t act_bytes = static_cast<size_t>(n + off) * es;
  DevBuf dx_in(x), dw(w), db(b), dr(r), drb(rb), dy_out(act_bytes), ds_out(act_bytes);
  DevBuf dmean(static_cast<size_t>(c.rows) * 4), drstd(static_cast<size_t>(c.rows) * 4);
  dy_out.poison();
  ds_out.poison();
  dmean.poison();
  drstd.poison();
  void* gw = c.affine ? dw.get() : nullptr;
  void* gb = c.affine ? db.get() : nullptr;
  if (res)
    cuda::add_layernorm_forward(types, dx_in.as<unsigned char>() + off * es, dr.get(), c.res_rows, gw, gb,
                                ds_out.as<unsigned char>() + off * es, dy_out.as<unsigned char>() + off * es,
                                dmean.as<float>(), drstd.as<float>(), c.rows, c.cols, eps, nullptr,
                                rbias ? drb.get() : nullptr);
  else
    cuda::layernorm_forward(types, dx_in.as<unsigned char>() + off * es, gw, gb,
                            dy_out.as<unsigned char>() + off * es, dmean.as<float>(), drstd.as<float>(),
                            c.rows, c.cols, eps, nullptr);
  BT_EXPECT_REL(slice(dy_out.to_host(dt, n + off), off, n), y_ref.vals(), tol(dt), "y");
  BT_EXPECT_REL(to_doubles(dmean.to_vector<float>(static_cast<size_t>(c.rows))), to_doubles(mean_ref), 1e-5,
                "mean");
  BT_EXPECT_REL(to_doubles(drstd.to_vector<float>(static_cast<size_t>(c.rows))), to_doubles(rstd_ref), 1e-5,
                "rstd");
  if (res) {
    // The sum: x + r (+ rb) in float rounded once, the CPU's bits.
    EXPECT_EQ(first_byte_mismatch(bytes_of(ds_out, off * es, n * es), s_ref.bytes, es), -1) << "s";
    // y: the plain forward's bits on that sum (what a recompute rebuilds).
    DevBuf dy2(act_bytes), dmean2(static_cast<size_t>(c.rows) * 4), drstd2(static_cast<size_t>(c.rows) * 4);
    dy2.poison();
    cuda::layernorm_forward(types, ds_out.as<unsigned char>() + off * es, gw, gb,
                            dy2.as<unsigned char>() + off * es, dmean2.as<float>(), drstd2.as<float>(),
                            c.rows, c.cols, eps, nullptr);
    EXPECT_EQ(first_byte_mismatch(bytes_of(dy2, off * es, n * es), bytes_of(dy_out, off * es, n * es), es),
              -1)
        << "y of the fused forward against the plain forward of its sum";
    EXPECT_EQ(dmean2.to_vector<float>(static_cast<size_t>(c.rows)),
              dmean.to_vector<float>(static_cast<size_t>(c.rows)));
    EXPECT_EQ(drstd2.to_vector<float>(static_cast<size_t>(c.rows)),
              drstd.to_vector<float>(static_cast<size_t>(c.rows)));
  }

  // ---- backward (the CPU's mean/rstd and the CPU's normalized input on both sides)
  const void* ln_in = res ? s_ref.data() : static_cast<const void*>(xp);
  HostBuf dx_ref(dt, n), dw_ref(pdt, c.cols), db_ref(pdt, c.cols), dsum_ref(pdt, c.cols);
  cpu::layernorm_backward(types, dyp, ln_in, wp, mean_ref.data(), rstd_ref.data(), dx_ref.data(),
                          c.affine ? dw_ref.data() : nullptr, c.affine ? db_ref.data() : nullptr, c.rows,
                          c.cols, res ? drp : nullptr, rbias ? dsum_ref.data() : nullptr);
  HostBuf in_host(dt, n + off);
  std::memcpy(static_cast<unsigned char*>(in_host.data()) + off * es, ln_in, static_cast<size_t>(n) * es);
  DevBuf ddy(dy), din(in_host), ddres(dres), dmean3(upload_vector(mean_ref)), drstd3(upload_vector(rstd_ref));
  DevBuf ddx(act_bytes), ddw(static_cast<size_t>(c.cols) * ps), ddb(static_cast<size_t>(c.cols) * ps),
      ddsum(static_cast<size_t>(c.cols) * ps);
  DevBuf scratch(cuda::layernorm_backward_scratch_floats(c.rows, c.cols, rbias) * sizeof(float));
  ddx.poison();
  ddw.poison();
  ddb.poison();
  ddsum.poison();
  scratch.poison();
  for (int rep = 0; rep < 2; ++rep) {  // twice: dx, dw and db are written, not accumulated
    cuda::layernorm_backward(
        types, ddy.as<unsigned char>() + off * es, din.as<unsigned char>() + off * es, gw, dmean3.as<float>(),
        drstd3.as<float>(), ddx.as<unsigned char>() + off * es, c.affine ? ddw.get() : nullptr,
        c.affine ? ddb.get() : nullptr, c.rows, c.cols, scratch.as<float>(), nullptr,
        res ? ddres.as<unsigned char>() + off * es : nullptr, rbias ? ddsum.get() : nullptr);
  }
  BT_EXPECT_REL(slice(ddx.to_host(dt, n + off), off, n), dx_ref.vals(), tol(dt), "dx");
  if (c.affine) {
    // Column sums over the rows, held to their terms' scale (Note [Tolerance
    // of a sum]): dy * xhat for dw, dy for db. f32 gradients of bf16
    // activations are sums in f32: f32's tolerance.
    std::vector<double> scale_w(static_cast<size_t>(c.cols)), scale_b(static_cast<size_t>(c.cols));
    for (int64_t i = 0; i < n; ++i) {
      const auto row = static_cast<size_t>(i / c.cols), col = static_cast<size_t>(i % c.cols);
      const double g = dy.get(off + i), xhat = (in_host.get(off + i) - mean_ref[row]) * rstd_ref[row];
      scale_b[col] += g * g;
      scale_w[col] += g * xhat * g * xhat;
    }
    for (size_t j = 0; j < scale_b.size(); ++j)
      scale_b[j] = std::sqrt(scale_b[j]), scale_w[j] = std::sqrt(scale_w[j]);
    BT_EXPECT_SUM_REL(ddw.to_host(pdt, c.cols).vals(), dw_ref.vals(), scale_w, tol(pdt), "dw");
    BT_EXPECT_SUM_REL(ddb.to_host(pdt, c.cols).vals(), db_ref.vals(), scale_b, tol(pdt), "db");
  }
  if (rbias) {
    // dx's column sums, held to the scale of their terms (dx as the CPU wrote it).
    std::vector<double> scale_s(static_cast<size_t>(c.cols));
    for (int64_t i = 0; i < n; ++i) scale_s[static_cast<size_t>(i % c.cols)] += dx_ref.get(i) * dx_ref.get(i);
    for (double& v : scale_s) v = std::sqrt(v);
    BT_EXPECT_SUM_REL(ddsum.to_host(pdt, c.cols).vals(), dsum_ref.vals(), scale_s, tol(pdt), "dsum");
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

TEST(CudaLayerNorm, F32ParametersWithBf16ActivationsMatchCpu) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  for (int64_t rows : {1, 129, 2500})
    for (int64_t cols : {31, 768, 1024, 2048}) run_case(DType::BF16, {rows, cols, true, 0, true}, gen);
  run_case(DType::BF16, {33, 768, true, 1, true}, gen);  // scalar path
  run_case(DType::BF16, {9, 4096, true, 0, true}, gen);  // long rows
}

// With and without a bias into the add and dsum in backward (Note [A bias
// into the residual add]).
TEST(CudaLayerNorm, ResidualAddMatchesCpu) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  for (DType dt : {DType::F32, DType::BF16})
    for (bool f32_params : {false, true})
      for (bool rb : {false, true}) {
        if (f32_params && dt != DType::BF16) continue;
        for (int64_t cols : {1, 31, 768, 1024}) {
          run_case(dt, {129, cols, true, 0, f32_params, 129, rb}, gen);  // one residual row per row
          run_case(dt, {128, cols, true, 0, f32_params, 32, rb},
                   gen);  // repeated over 4 (positions under a batch)
        }
        run_case(dt, {33, 768, true, 1, f32_params, 33, rb}, gen);       // unaligned x and s: scalar path
        run_case(dt, {64, 768, true, 0, f32_params, 1, rb}, gen);        // one residual row for all
        run_case(dt, {9, 4096, true, 0, f32_params, 9, rb}, gen);        // long rows
        run_case(dt, {2500, 64, false, 0, f32_params, 2500, rb}, gen);   // no affine, many rows
        run_case(dt, {2500, 768, false, 0, f32_params, 2500, rb}, gen);  // ... fast path, 3 partial sums
      }
}

// x or r misaligned while s, y, w and b are aligned: s is written by its own
// pass and the fast plain forward reads it; y is still its bits on s.
TEST(CudaLayerNorm, ResidualAddWithAMisalignedInput) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  for (DType dt : {DType::F32, DType::BF16}) {
    const int64_t rows = 17, cols = 768, n = rows * cols;
    const size_t es = dtype_size(dt);
    const HostBuf x = randn_buf(dt, n + 1, gen), r = randn_buf(dt, n + 1, gen), w = random_buf(dt, cols, gen);
    HostBuf s_ref(dt, n), y_ref(dt, n);
    std::vector<float> m(rows), rs(rows);
    for (int which = 0; which < 2; ++which) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << (which == 0 ? " x" : " r") << " misaligned");
      const int64_t xo = which == 0 ? 1 : 0, ro = which == 1 ? 1 : 0;
      cpu::add_layernorm_forward(dt, static_cast<const unsigned char*>(x.data()) + xo * es,
                                 static_cast<const unsigned char*>(r.data()) + ro * es, rows, w.data(),
                                 nullptr, s_ref.data(), y_ref.data(), m.data(), rs.data(), rows, cols, 1e-5f);
      DevBuf dx(x), dr(r), dw(w), ds(static_cast<size_t>(n) * es), dy(static_cast<size_t>(n) * es),
          dy2(static_cast<size_t>(n) * es), dm(rows * 4), drs(rows * 4);
      ds.poison();
      dy.poison();
      cuda::add_layernorm_forward(dt, dx.as<unsigned char>() + xo * es, dr.as<unsigned char>() + ro * es,
                                  rows, dw.get(), nullptr, ds.get(), dy.get(), dm.as<float>(),
                                  drs.as<float>(), rows, cols, 1e-5f, nullptr);
      EXPECT_EQ(first_byte_mismatch(bytes_of(ds, 0, n * es), s_ref.bytes, es), -1) << "s";
      BT_EXPECT_REL(dy.to_host(dt, n).vals(), y_ref.vals(), tol(dt), "y");
      cuda::layernorm_forward(dt, ds.get(), dw.get(), nullptr, dy2.get(), dm.as<float>(), drs.as<float>(),
                              rows, cols, 1e-5f, nullptr);
      EXPECT_EQ(first_byte_mismatch(bytes_of(dy2, 0, n * es), bytes_of(dy, 0, n * es), es), -1) << "y";
    }
  }
}

}  // namespace
}  // namespace bt::test::gpu
