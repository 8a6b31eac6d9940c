// LayerNorm forward/backward against double references and finite differences;
// f32 parameters with bf16 activations against the f32 kernel; the residual
// add (Note [Residual into LayerNorm]) and a bias into it (Note [A bias into
// the residual add]) against the plain kernel.
#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/layernorm.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace bt::test {
namespace {
namespace cpu = kernels::cpu;

struct Stats {
  std::vector<double> mean, rstd;
};

Stats ref_stats(const std::vector<double>& x, int64_t rows, int64_t cols, double eps) {
  Stats s;
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < cols; ++j) m += x[r * cols + j];
    m /= cols;
    for (int64_t j = 0; j < cols; ++j) v += (x[r * cols + j] - m) * (x[r * cols + j] - m);
    v /= cols;
    s.mean.push_back(m);
    s.rstd.push_back(1.0 / std::sqrt(v + eps));
  }
  return s;
}

std::vector<double> ref_forward(const std::vector<double>& x, const std::vector<double>* w,
                                const std::vector<double>* b, int64_t rows, int64_t cols, double eps) {
  const Stats s = ref_stats(x, rows, cols, eps);
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      double v = (x[r * cols + j] - s.mean[r]) * s.rstd[r];
      if (w) v *= (*w)[j];
      if (b) v += (*b)[j];
      y[r * cols + j] = v;
    }
  return y;
}

struct Grads {
  std::vector<double> dx, dw, db;
};

/// Backward formula with the given per-row statistics.
Grads ref_backward(const std::vector<double>& dy, const std::vector<double>& x, const std::vector<double>* w,
                   const std::vector<double>& mean, const std::vector<double>& rstd, int64_t rows,
                   int64_t cols) {
  Grads g{std::vector<double>(x.size()), std::vector<double>(cols, 0.0), std::vector<double>(cols, 0.0)};
  for (int64_t r = 0; r < rows; ++r) {
    double c1 = 0, c2 = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const double xh = (x[r * cols + j] - mean[r]) * rstd[r], gj = dy[r * cols + j] * (w ? (*w)[j] : 1.0);
      c1 += gj, c2 += gj * xh;
      g.dw[j] += dy[r * cols + j] * xh;
      g.db[j] += dy[r * cols + j];
    }
    c1 /= cols, c2 /= cols;
    for (int64_t j = 0; j < cols; ++j) {
      const double xh = (x[r * cols + j] - mean[r]) * rstd[r], gj = dy[r * cols + j] * (w ? (*w)[j] : 1.0);
      g.dx[r * cols + j] = rstd[r] * (gj - c1 - xh * c2);
    }
  }
  return g;
}

const std::pair<int64_t, int64_t> kShapes[] = {{1, 1}, {1, 17}, {3, 33}, {17, 3}, {4, 256}, {33, 64}};

TEST(LayerNormCpu, Forward) {
  uint32_t seed = 1;
  const float eps = 1e-5f;
  for (DType dt : kFloatTypes)
    for (auto [rows, cols] : kShapes)
      for (bool affine : {true, false}) {
        std::vector<double> xs = randn(rows * cols, seed++, 2.0);
        for (auto& v : xs) v += 0.5;
        Buf x(dt, xs), w = rand_buf(dt, cols, seed++), b = rand_buf(dt, cols, seed++), y(dt, rows * cols);
        std::vector<float> mean(rows), rstd(rows);
        cpu::layernorm_forward(dt, x.data(), affine ? w.data() : nullptr, affine ? b.data() : nullptr,
                               y.data(), mean.data(), rstd.data(), rows, cols, eps);
        const std::vector<double> xv = x.vals(), wv = w.vals(), bv = b.vals();
        const auto ref = ref_forward(xv, affine ? &wv : nullptr, affine ? &bv : nullptr, rows, cols, eps);
        EXPECT_LT(rel_err(y.vals(), ref), tol(dt)) << name_of(dt) << " " << rows << "x" << cols;
        const Stats s = ref_stats(xv, rows, cols, eps);
        EXPECT_LT(rel_err(std::vector<double>(mean.begin(), mean.end()), s.mean), 1e-5);
        EXPECT_LT(rel_err(std::vector<double>(rstd.begin(), rstd.end()), s.rstd), 1e-5);
      }
}

TEST(LayerNormCpu, Backward) {
  uint32_t seed = 500;
  const float eps = 1e-5f;
  for (DType dt : kFloatTypes)
    for (auto [rows, cols] : kShapes)
      for (bool affine : {true, false}) {
        SCOPED_TRACE(bt::cat(dtype_name(dt), " ", rows, "x", cols, " affine=", affine));
        std::vector<double> xs = randn(rows * cols, seed++, 2.0);
        for (auto& v : xs) v += 0.5;
        Buf x(dt, xs), w = rand_buf(dt, cols, seed++), b = rand_buf(dt, cols, seed++), y(dt, rows * cols);
        Buf dy = rand_buf(dt, rows * cols, seed++), dx(dt, rows * cols), dw(dt, cols), db(dt, cols);
        for (int64_t j = 0; j < cols; ++j) dw.set(j, 123.0), db.set(j, -7.0);  // must be overwritten
        std::vector<float> mean(rows), rstd(rows);
        const void* wp = affine ? w.data() : nullptr;
        cpu::layernorm_forward(dt, x.data(), wp, affine ? b.data() : nullptr, y.data(), mean.data(),
                               rstd.data(), rows, cols, eps);
        cpu::layernorm_backward(dt, dy.data(), x.data(), wp, mean.data(), rstd.data(), dx.data(),
                                affine ? dw.data() : nullptr, affine ? db.data() : nullptr, rows, cols);
        const std::vector<double> xv = x.vals(), wv = w.vals(), dyv = dy.vals();
        const Stats s = ref_stats(xv, rows, cols, eps);
        const Grads exact = ref_backward(dyv, xv, affine ? &wv : nullptr, s.mean, s.rstd, rows, cols);
        if (dt == DType::F64) {
          // The contract hands rstd over as float: F64 must match the formula
          // evaluated with that rstd (and the exact double mean) to 1e-12, and
          // the exact gradient to float-rstd accuracy.
          const Grads given = ref_backward(dyv, xv, affine ? &wv : nullptr, s.mean,
                                           std::vector<double>(rstd.begin(), rstd.end()), rows, cols);
          EXPECT_LT(rel_err(dx.vals(), given.dx), 1e-12);
          if (affine) {
            EXPECT_LT(rel_err(dw.vals(), given.dw), 1e-12);
          }
          EXPECT_LT(rel_err(dx.vals(), exact.dx), 1e-6);
        } else {
          EXPECT_LT(rel_err(dx.vals(), exact.dx), tol(dt));
        }
        if (affine) {
          EXPECT_LT(rel_err(dw.vals(), exact.dw), dt == DType::F64 ? 1e-6 : tol(dt));
          EXPECT_LT(rel_err(db.vals(), exact.db), tol(dt));
        } else {
          EXPECT_EQ(dw.get(0), 123.0);  // untouched when null
        }
      }
}

TEST(LayerNormCpu, F64BackwardMatchesFiniteDifferences) {
  // L = sum(dy * y(x, w, b)); compare dL/dx, dL/dw, dL/db by central differences.
  const int64_t rows = 3, cols = 17;
  const float eps = 1e-5f;
  std::vector<double> x = randn(rows * cols, 11), w = randn(cols, 12), b = randn(cols, 13),
                      dy = randn(rows * cols, 14);
  for (auto& v : x) v += 100.0;  // a large mean: the F64 path must not lose it to float
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww,
                  const std::vector<double>& bb) {
    std::vector<double> y(rows * cols);
    cpu::layernorm_forward(DType::F64, xx.data(), ww.data(), bb.data(), y.data(), nullptr, nullptr, rows,
                           cols, eps);
    double l = 0;
    for (int64_t i = 0; i < rows * cols; ++i) l += dy[i] * y[i];
    return l;
  };
  std::vector<double> y(rows * cols), dx(rows * cols), dw(cols), db(cols);
  std::vector<float> mean(rows), rstd(rows);
  cpu::layernorm_forward(DType::F64, x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows,
                         cols, eps);
  cpu::layernorm_backward(DType::F64, dy.data(), x.data(), w.data(), mean.data(), rstd.data(), dx.data(),
                          dw.data(), db.data(), rows, cols);
  const double h = 1e-5;
  std::vector<double> ndx, ndw, ndb;
  for (int64_t i = 0; i < rows * cols; ++i) {
    auto xp = x, xm = x;
    xp[i] += h, xm[i] -= h;
    ndx.push_back((loss(xp, w, b) - loss(xm, w, b)) / (2 * h));
  }
  for (int64_t j = 0; j < cols; ++j) {
    auto wp = w, wm = w, bp = b, bm = b;
    wp[j] += h, wm[j] -= h, bp[j] += h, bm[j] -= h;
    ndw.push_back((loss(x, wp, b) - loss(x, wm, b)) / (2 * h));
    ndb.push_back((loss(x, w, bp) - loss(x, w, bm)) / (2 * h));
  }
  EXPECT_LT(rel_err(dx, ndx), 1e-6);
  EXPECT_LT(rel_err(dw, ndw), 1e-6);
  EXPECT_LT(rel_err(db, ndb), 1e-8);
}

// f32 (or bf16) parameters with bf16 activations compute what the f32 kernel
// computes on the same values, rounding only the activations' outputs to bf16:
// y and dx are the f32 kernel's rounded once, the statistics and the f32 dw/db
// its very bits (an f32 gradient made through bf16 would lose them).
TEST(LayerNormCpu, F32ParametersWithBf16Activations) {
  uint32_t seed = 900;
  const float eps = 1e-5f;
  for (DType wdt : {DType::F32, DType::BF16})
    for (auto [rows, cols] : kShapes) {
      SCOPED_TRACE(bt::cat("params ", dtype_name(wdt), " ", rows, "x", cols));
      const int64_t n = rows * cols;
      const Buf x(DType::BF16, randn(n, seed++, 2.0)), dy = rand_buf(DType::BF16, n, seed++);
      const Buf w(wdt, randn(cols, seed++)), b(wdt, randn(cols, seed++));
      // The same values in f32: the reference.
      const Buf x32(DType::F32, x.vals()), dy32(DType::F32, dy.vals()), w32(DType::F32, w.vals()),
          b32(DType::F32, b.vals());
      Buf y(DType::BF16, n), y32(DType::F32, n), dx(DType::BF16, n), dx32(DType::F32, n);
      Buf dw(DType::F32, cols), db(DType::F32, cols), dw32(DType::F32, cols), db32(DType::F32, cols);
      std::vector<float> mean(rows), rstd(rows), mean32(rows), rstd32(rows);
      const kernels::LnTypes t{DType::BF16, wdt, DType::F32};
      cpu::layernorm_forward(t, x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows, cols,
                             eps);
      cpu::layernorm_forward(DType::F32, x32.data(), w32.data(), b32.data(), y32.data(), mean32.data(),
                             rstd32.data(), rows, cols, eps);
      EXPECT_EQ(mean, mean32);
      EXPECT_EQ(rstd, rstd32);
      EXPECT_EQ(y.vals(), Buf(DType::BF16, y32.vals()).vals()) << "y: the f32 result rounded once";
      cpu::layernorm_backward(t, dy.data(), x.data(), w.data(), mean.data(), rstd.data(), dx.data(),
                              dw.data(), db.data(), rows, cols);
      cpu::layernorm_backward(DType::F32, dy32.data(), x32.data(), w32.data(), mean32.data(), rstd32.data(),
                              dx32.data(), dw32.data(), db32.data(), rows, cols);
      EXPECT_EQ(dx.vals(), Buf(DType::BF16, dx32.vals()).vals()) << "dx: the f32 result rounded once";
      EXPECT_EQ(dw.vals(), dw32.vals()) << "dw: the f32 kernel's bits";
      EXPECT_EQ(db.vals(), db32.vals()) << "db: the f32 kernel's bits";
    }
}

// The residual add writes s = x + r rounded to the dtype, and y, mean and rstd
// are the plain forward's bits on that s (what a recompute from s rebuilds);
// r repeats over the rows when it has fewer.
TEST(LayerNormCpu, AddForwardIsThePlainForwardOfTheRoundedSum) {
  uint32_t seed = 1300;
  const float eps = 1e-5f;
  for (DType dt : kFloatTypes)
    for (auto [rows, cols] : kShapes)
      for (int64_t r_rows : {rows, int64_t{1}}) {
        SCOPED_TRACE(bt::cat(dtype_name(dt), " ", rows, "x", cols, " residual rows ", r_rows));
        const int64_t n = rows * cols;
        const Buf x = rand_buf(dt, n, seed++, 2.0), r = rand_buf(dt, r_rows * cols, seed++),
                  w = rand_buf(dt, cols, seed++), b = rand_buf(dt, cols, seed++);
        std::vector<double> sum(n);
        for (int64_t i = 0; i < n; ++i) sum[i] = x.get(i) + r.get(i % (r_rows * cols));
        Buf s(dt, n), y(dt, n), y_plain(dt, n);
        std::vector<float> mean(rows), rstd(rows), mean_plain(rows), rstd_plain(rows);
        cpu::add_layernorm_forward(dt, x.data(), r.data(), r_rows, w.data(), b.data(), s.data(), y.data(),
                                   mean.data(), rstd.data(), rows, cols, eps);
        if (dt == DType::F64)
          EXPECT_EQ(s.vals(), sum);
        else  // x + r in float, rounded once: the add op's bits
          for (int64_t i = 0; i < n; ++i) {
            Buf one(dt, 1);
            one.set(0, static_cast<float>(x.get(i)) + static_cast<float>(r.get(i % (r_rows * cols))));
            ASSERT_EQ(s.get(i), one.get(0)) << "s[" << i << "]";
          }
        cpu::layernorm_forward(dt, s.data(), w.data(), b.data(), y_plain.data(), mean_plain.data(),
                               rstd_plain.data(), rows, cols, eps);
        EXPECT_EQ(std::memcmp(y.data(), y_plain.data(), y.bytes.size()), 0) << "y";
        EXPECT_EQ(mean, mean_plain);
        EXPECT_EQ(rstd, rstd_plain);
      }
}

// dres is added to dx in the pass that makes dx: exactly dx + dres rounded
// once (the f32/f64 dx is the plain dx plus dres, the same bits as adding them
// apart); dw and db do not see it. dsum is the column sums of dx as written
// (Note [A bias into the residual add]).
TEST(LayerNormCpu, BackwardAddsTheResidualGradientAndSumsDx) {
  uint32_t seed = 1700;
  const float eps = 1e-5f;
  for (DType dt : kFloatTypes)
    for (auto [rows, cols] : kShapes) {
      SCOPED_TRACE(bt::cat(dtype_name(dt), " ", rows, "x", cols));
      const int64_t n = rows * cols;
      const Buf x = rand_buf(dt, n, seed++, 2.0), w = rand_buf(dt, cols, seed++),
                dy = rand_buf(dt, n, seed++), dres = rand_buf(dt, n, seed++, 3.0);
      Buf y(dt, n), dx(dt, n), dx_plain(dt, n), dw(dt, cols), db(dt, cols), dw_plain(dt, cols),
          db_plain(dt, cols), dsum(dt, cols);
      std::vector<float> mean(rows), rstd(rows);
      cpu::layernorm_forward(dt, x.data(), w.data(), nullptr, y.data(), mean.data(), rstd.data(), rows, cols,
                             eps);
      cpu::layernorm_backward(dt, dy.data(), x.data(), w.data(), mean.data(), rstd.data(), dx_plain.data(),
                              dw_plain.data(), db_plain.data(), rows, cols);
      cpu::layernorm_backward(dt, dy.data(), x.data(), w.data(), mean.data(), rstd.data(), dx.data(),
                              dw.data(), db.data(), rows, cols, dres.data(), dsum.data());
      EXPECT_EQ(dw.vals(), dw_plain.vals());
      EXPECT_EQ(db.vals(), db_plain.vals());
      // dsum against the sums in double of the dx written, held to the terms' scale
      // (and to a rounding to bf16).
      std::vector<double> col_sum(cols, 0.0), scale(cols, 0.0);
      for (int64_t i = 0; i < n; ++i) {
        col_sum[i % cols] += dx.get(i);
        scale[i % cols] += std::fabs(dx.get(i));
      }
      const double t = dt == DType::F64 ? 1e-13 : dt == DType::BF16 ? 4e-3 : 1e-6;
      for (int64_t j = 0; j < cols; ++j)
        EXPECT_LE(std::fabs(dsum.get(j) - col_sum[j]), t * scale[j]) << "dsum[" << j << "]";
      std::vector<double> want(n);
      for (int64_t i = 0; i < n; ++i) want[i] = dx_plain.get(i) + dres.get(i);
      if (dt == DType::BF16) {
        // Rounded once from float: within half a bf16 ulp of the float sum.
        const Stats st = ref_stats(x.vals(), rows, cols, eps);
        const std::vector<double> wv = w.vals();
        const Grads exact = ref_backward(dy.vals(), x.vals(), &wv, st.mean, st.rstd, rows, cols);
        for (int64_t i = 0; i < n; ++i) want[i] = exact.dx[i] + dres.get(i);
        EXPECT_LT(rel_err(dx.vals(), want), tol(dt));
      } else {
        EXPECT_EQ(dx.vals(), Buf(dt, want).vals()) << "dx + dres, rounded once";
      }
    }
}

// Note [A bias into the residual add]: s = x + (r + rb), r + rb in float, then
// x, rounded once -- in f32 and f64 the bits of r + rb added apart and then
// the plain residual add; f32 parameters with bf16 activations too. y is the
// plain forward's bits on s.
TEST(LayerNormCpu, ABiasIntoTheResidualAdd) {
  uint32_t seed = 1900;
  const float eps = 1e-5f;
  for (DType dt : kFloatTypes)
    for (DType pdt : {dt, DType::F32}) {
      if (pdt != dt && dt != DType::BF16) continue;
      const kernels::LnTypes types{dt, pdt, pdt};
      for (auto [rows, cols] : kShapes)
        for (int64_t r_rows : {rows, int64_t{1}}) {
          SCOPED_TRACE(bt::cat(dtype_name(dt), " params ", dtype_name(pdt), " ", rows, "x", cols,
                               " residual rows ", r_rows));
          const int64_t n = rows * cols;
          const Buf x = rand_buf(dt, n, seed++, 2.0), r = rand_buf(dt, r_rows * cols, seed++),
                    rb = rand_buf(pdt, cols, seed++), w = rand_buf(pdt, cols, seed++),
                    b = rand_buf(pdt, cols, seed++);
          Buf s(dt, n), y(dt, n), y_plain(dt, n);
          std::vector<float> mean(rows), rstd(rows), mean_plain(rows), rstd_plain(rows);
          cpu::add_layernorm_forward(types, x.data(), r.data(), r_rows, w.data(), b.data(), s.data(),
                                     y.data(), mean.data(), rstd.data(), rows, cols, eps, rb.data());
          // r + rb as the kernel adds them: in double for f64, else in float (exact in a double).
          const auto r_plus_rb = [&](int64_t i) {
            const double rv = r.get(i % (r_rows * cols)), bv = rb.get(i % cols);
            return dt == DType::F64 ? rv + bv
                                    : static_cast<double>(static_cast<float>(rv) + static_cast<float>(bv));
          };
          for (int64_t i = 0; i < n; ++i) {
            Buf one(dt, 1);
            if (dt == DType::F64)
              one.set(0, x.get(i) + r_plus_rb(i));
            else
              one.set(0, static_cast<float>(x.get(i)) + static_cast<float>(r_plus_rb(i)));
            ASSERT_EQ(s.get(i), one.get(0)) << "s[" << i << "]";
          }
          if (dt != DType::BF16) {
            // r + rb apart (rounded to r's dtype: exact for f64, one rounding for f32), then the plain add.
            Buf rr(dt, n), s_apart(dt, n), y_apart(dt, n);
            for (int64_t i = 0; i < n; ++i) rr.set(i, r_plus_rb(i));
            cpu::add_layernorm_forward(types, x.data(), rr.data(), rows, w.data(), b.data(), s_apart.data(),
                                       y_apart.data(), mean_plain.data(), rstd_plain.data(), rows, cols, eps);
            EXPECT_EQ(s.vals(), s_apart.vals()) << "s against r + rb added apart";
          }
          cpu::layernorm_forward(types, s.data(), w.data(), b.data(), y_plain.data(), mean_plain.data(),
                                 rstd_plain.data(), rows, cols, eps);
          EXPECT_EQ(std::memcmp(y.data(), y_plain.data(), y.bytes.size()), 0) << "y";
          EXPECT_EQ(mean, mean_plain);
          EXPECT_EQ(rstd, rstd_plain);
        }
    }
}

TEST(LayerNormCpu, Errors) {
  std::vector<int32_t> buf(8);
  std::vector<float> s(2);
  expect_error(
      [&] {
        cpu::layernorm_forward(DType::I32, buf.data(), nullptr, nullptr, buf.data(), s.data(), s.data(), 2, 4,
                               1e-5f);
      },
      "layernorm_forward: unsupported dtype i32");
  expect_error(
      [&] {
        cpu::layernorm_backward(DType::F16, buf.data(), buf.data(), nullptr, s.data(), s.data(), buf.data(),
                                nullptr, nullptr, 2, 4);
      },
      "layernorm_backward");
  expect_error(
      [&] {
        cpu::layernorm_forward(DType::F32, buf.data(), nullptr, nullptr, buf.data(), s.data(), s.data(), 2, 0,
                               1e-5f);
      },
      "cols");
  expect_error(
      [&] {
        cpu::layernorm_forward(kernels::LnTypes{DType::F32, DType::BF16, DType::F32}, buf.data(), buf.data(),
                               nullptr, buf.data(), s.data(), s.data(), 2, 4, 1e-5f);
      },
      "parameters in bf16 and their gradients in f32 do not go with f32 activations");
  expect_error(
      [&] {
        cpu::add_layernorm_forward(DType::F32, buf.data(), buf.data(), 3, nullptr, nullptr, buf.data(),
                                   buf.data(), s.data(), s.data(), 2, 4, 1e-5f);
      },
      "the residual's rows (3) must divide the rows (2)");
  // dsum sums dx: it needs dx; over no rows it is zeros.
  std::vector<float> dsum(4, 7.0f), unused(4);
  expect_error(
      [&] {
        cpu::layernorm_backward(DType::F32, unused.data(), unused.data(), nullptr, s.data(), s.data(),
                                nullptr, nullptr, nullptr, 1, 4, nullptr, dsum.data());
      },
      "layernorm_backward: dsum sums dx, which must not be null");
  cpu::layernorm_backward(DType::F32, unused.data(), unused.data(), nullptr, s.data(), s.data(),
                          unused.data(), nullptr, nullptr, 0, 4, nullptr, dsum.data());
  EXPECT_EQ(dsum, std::vector<float>(4, 0.0f));
}

}  // namespace
}  // namespace bt::test
