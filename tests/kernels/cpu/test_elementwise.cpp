// Broadcasting binary ops and unary ops against double references.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/elementwise.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace bt::test {
namespace {
using kernels::BinaryOp;
using kernels::StridedLayout;
using kernels::UnaryOp;
namespace cpu = kernels::cpu;

double ref_binary(BinaryOp op, double x, double y) {
  switch (op) {
    case BinaryOp::Add:
      return x + y;
    case BinaryOp::Sub:
      return x - y;
    case BinaryOp::Mul:
      return x * y;
    case BinaryOp::Div:
      return x / y;
    case BinaryOp::Pow:
      return std::pow(x, y);
  }
  return NAN;
}

StridedLayout make_layout(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  StridedLayout l;
  l.ndim = static_cast<int>(shape.size());
  for (int d = 0; d < l.ndim; ++d) l.shape[d] = shape[d], l.strides[d] = strides[d];
  return l;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size());
  int64_t st = 1;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) s[d] = st, st *= shape[d];
  return s;
}

/// Element offsets of every output element in a layout (naive reference).
int64_t offset_ref(const StridedLayout& l, int64_t lin) {
  int64_t off = 0;
  for (int d = l.ndim - 1; d >= 0; --d) {
    off += (lin % l.shape[d]) * l.strides[d];
    lin /= l.shape[d];
  }
  return off;
}

struct BinCase {
  std::vector<int64_t> shape, sa, sb;  // output shape; operand strides (0 = broadcast)
  int64_t na, nb;                      // operand buffer sizes
};

TEST(ElementwiseCpu, BinaryBroadcastAndStrides) {
  const std::vector<BinCase> cases = {
      {{1}, {1}, {1}, 1, 1},
      {{17}, {1}, {1}, 17, 17},
      {{33}, {1}, {0}, 33, 1},                     // scalar b
      {{3, 5}, {5, 1}, {0, 1}, 15, 5},             // row vector b
      {{3, 5}, {1, 3}, {1, 0}, 15, 3},             // transposed a, column b
      {{2, 3, 4}, {12, 4, 1}, {1, 2, 6}, 24, 24},  // permuted b
      {{4, 1, 7}, {0, 5, 1}, {7, 0, 1}, 7, 28},    // broadcast both ways
      {{}, {}, {}, 1, 1},                          // 0-d
      {{0, 3}, {3, 1}, {0, 1}, 1, 3},              // empty
  };
  const BinaryOp ops[] = {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Pow};
  uint32_t seed = 1;
  for (DType dt : kFloatTypes)
    for (const auto& c : cases)
      for (BinaryOp op : ops) {
        const StridedLayout la = make_layout(c.shape, c.sa), lb = make_layout(c.shape, c.sb);
        int64_t n = 1;
        for (int64_t s : c.shape) n *= s;
        // Positive a for Pow; b away from 0 for Div.
        Buf a(dt, randu(c.na, seed++, 0.5, 2.0)), b(dt, randu(c.nb, seed++, 0.5, 2.0));
        if (op != BinaryOp::Div) b = Buf(dt, randu(c.nb, seed++, -2.0, 2.0));
        Buf out(dt, std::max<int64_t>(n, 1));
        cpu::binary(op, dt, a.data(), la, b.data(), lb, out.data());
        const std::vector<double> av = a.vals(), bv = b.vals();
        std::vector<double> ref(n), got(n);
        for (int64_t i = 0; i < n; ++i) {
          ref[i] = ref_binary(op, av[offset_ref(la, i)], bv[offset_ref(lb, i)]);
          got[i] = out.get(i);
        }
        EXPECT_LT(rel_err(got, ref), tol(dt))
            << name_of(dt) << " op " << static_cast<int>(op) << " ndim " << c.shape.size();
      }
}

TEST(ElementwiseCpu, BinaryOutputMayAliasContiguousInput) {
  for (DType dt : kFloatTypes) {
    const std::vector<int64_t> shape = {5, 7};
    const StridedLayout lc = make_layout(shape, contiguous_strides(shape)), lrow = make_layout(shape, {0, 1});
    Buf a = rand_buf(dt, 35, 3), b = rand_buf(dt, 7, 4);
    const std::vector<double> av = a.vals(), bv = b.vals();
    cpu::binary(BinaryOp::Mul, dt, a.data(), lc, b.data(), lrow, a.data());
    std::vector<double> ref(35);
    for (int i = 0; i < 35; ++i) ref[i] = av[i] * bv[i % 7];
    EXPECT_LT(rel_err(a.vals(), ref), tol(dt)) << name_of(dt);
  }
}

TEST(ElementwiseCpu, Unary) {
  struct U {
    UnaryOp op;
    double scalar, lo, hi;
    double (*f)(double, double);
  };
  const U ops[] = {
      {UnaryOp::Neg, 0, -3, 3, [](double x, double) { return -x; }},
      {UnaryOp::Exp, 0, -5, 5, [](double x, double) { return std::exp(x); }},
      {UnaryOp::Log, 0, 0.01, 10, [](double x, double) { return std::log(x); }},
      {UnaryOp::Tanh, 0, -4, 4, [](double x, double) { return std::tanh(x); }},
      {UnaryOp::Sqrt, 0, 0, 9, [](double x, double) { return std::sqrt(x); }},
      {UnaryOp::PowScalar, 2.5, 0.1, 3, [](double x, double s) { return std::pow(x, s); }},
      {UnaryOp::PowScalar, -1.0, 0.5, 3, [](double x, double s) { return std::pow(x, s); }},
      {UnaryOp::AddScalar, 0.75, -3, 3, [](double x, double s) { return x + s; }},
      {UnaryOp::MulScalar, -1.5, -3, 3, [](double x, double s) { return x * s; }},
  };
  uint32_t seed = 100;
  for (DType dt : kFloatTypes)
    for (const U& u : ops)
      for (int64_t n : {1, 3, 17, 33, 1000}) {
        Buf a(dt, randu(n, seed++, u.lo, u.hi)), out(dt, n);
        cpu::unary(u.op, dt, a.data(), out.data(), n, u.scalar);
        std::vector<double> ref(n);
        const std::vector<double> av = a.vals();
        for (int64_t i = 0; i < n; ++i) ref[i] = u.f(av[i], u.scalar);
        EXPECT_LT(rel_err(out.vals(), ref), tol(dt)) << name_of(dt) << " op " << static_cast<int>(u.op);
        // In place.
        cpu::unary(u.op, dt, a.data(), a.data(), n, u.scalar);
        EXPECT_EQ(a.bytes, out.bytes) << name_of(dt) << " in place, op " << static_cast<int>(u.op);
      }
}

TEST(ElementwiseCpu, Errors) {
  std::vector<int32_t> buf(8);
  const StridedLayout l = make_layout({4}, {1});
  expect_error([&] { cpu::unary(UnaryOp::Neg, DType::I32, buf.data(), buf.data(), 4, 0); },
               "unsupported dtype i32");
  expect_error([&] { cpu::binary(BinaryOp::Add, DType::F16, buf.data(), l, buf.data(), l, buf.data()); },
               "binary");
  const StridedLayout l5 = make_layout({5}, {1});
  expect_error([&] { cpu::binary(BinaryOp::Add, DType::F32, buf.data(), l, buf.data(), l5, buf.data()); },
               "shapes differ");
}

}  // namespace
}  // namespace bt::test
