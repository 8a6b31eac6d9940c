// GPU broadcasting binary ops and unary ops against the CPU kernels.
#include <vector>

#include <gtest/gtest.h>

#include "kernels/elementwise.h"
#include "tests/kernels/cuda/gpu_test_util.h"

namespace bt::test::gpu {
namespace {
namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;
using kernels::BinaryOp;
using kernels::StridedLayout;
using kernels::UnaryOp;

/// One input of a binary op: its storage extent and its view (output shape).
struct Input {
  std::vector<int64_t> strides;
  int64_t extent;
};

struct BinCase {
  std::vector<int64_t> shape;
  Input a, b;
};

StridedLayout layout(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  StridedLayout l;
  l.ndim = static_cast<int>(shape.size());
  for (int d = 0; d < l.ndim; ++d) {
    l.shape[d] = shape[d];
    l.strides[d] = strides[d];
  }
  return l;
}

const std::vector<BinCase>& bin_cases() {
  static const std::vector<BinCase> cases = {
      {{1}, {{1}, 1}, {{1}, 1}},
      {{7}, {{1}, 7}, {{1}, 7}},
      {{1000}, {{1}, 1000}, {{1}, 1000}},
      {{1023}, {{1}, 1023}, {{1}, 1023}},
      {{7, 31}, {{1, 0}, 7}, {{0, 1}, 31}},               // outer-product broadcast
      {{129, 33}, {{33, 1}, 129 * 33}, {{0, 0}, 1}},      // scalar b
      {{13, 7}, {{1, 13}, 91}, {{7, 1}, 91}},             // transposed a
      {{3, 5, 17}, {{85, 17, 1}, 255}, {{0, 1, 5}, 85}},  // broadcast + permuted b
  };
  return cases;
}

std::vector<double> operand_vals(BinaryOp op, bool is_b, int64_t n, std::mt19937& gen) {
  if (op == BinaryOp::Pow) return is_b ? uniform_vals(n, gen, -2.0, 2.0) : uniform_vals(n, gen, 0.5, 2.0);
  if (op == BinaryOp::Div && is_b) {
    auto v = uniform_vals(n, gen, 0.5, 2.0);
    for (size_t i = 0; i < v.size(); i += 2) v[i] = -v[i];
    return v;
  }
  return uniform_vals(n, gen, -2.0, 2.0);
}

TEST(CudaElementwise, BinaryMatchesCpu) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  for (DType dt : {DType::F32, DType::BF16}) {
    for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Pow}) {
      for (const BinCase& c : bin_cases()) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " op " << static_cast<int>(op) << " ndim "
                                          << c.shape.size() << " dim0 " << c.shape[0]);
        const StridedLayout la = layout(c.shape, c.a.strides), lb = layout(c.shape, c.b.strides);
        int64_t n = 1;
        for (int64_t s : c.shape) n *= s;
        const HostBuf a(dt, operand_vals(op, false, c.a.extent, gen));
        const HostBuf b(dt, operand_vals(op, true, c.b.extent, gen));
        HostBuf ref(dt, n);
        cpu::binary(op, dt, a.data(), la, b.data(), lb, ref.data());
        DevBuf da(a), db(b), dout(ref.size_bytes());
        dout.poison();
        cuda::binary(op, dt, da.get(), la, db.get(), lb, dout.get(), nullptr);
        BT_EXPECT_REL(dout.to_host(dt, n).vals(), ref.vals(), tol(dt), "binary");
      }
    }
  }
}

TEST(CudaElementwise, BinaryInPlaceAndUnaligned) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  for (DType dt : {DType::F32, DType::BF16}) {
    const int64_t n = 1001;
    const StridedLayout l = layout({n}, {1});
    const HostBuf a = random_buf(dt, n + 1, gen), b = random_buf(dt, n + 1, gen);
    HostBuf ref(dt, n);
    const size_t es = dtype_size(dt);
    cpu::binary(BinaryOp::Mul, dt, static_cast<const unsigned char*>(a.data()) + es, l,
                static_cast<const unsigned char*>(b.data()) + es, l, ref.data());
    DevBuf da(a), db(b);
    // out aliases a (allowed: a is contiguous with the output's shape); both start 1 element in.
    cuda::binary(BinaryOp::Mul, dt, da.as<unsigned char>() + es, l, db.as<unsigned char>() + es, l,
                 da.as<unsigned char>() + es, nullptr);
    const std::vector<double> all = da.to_host(dt, n + 1).vals();
    const std::vector<double> got(all.begin() + 1, all.end());
    BT_EXPECT_REL(got, ref.vals(), tol(dt), "in-place unaligned mul");
  }
}

TEST(CudaElementwise, UnaryMatchesCpu) {
  BT_SKIP_WITHOUT_GPU();
  BT_SEED(seed);
  std::mt19937 gen(seed);
  const std::pair<UnaryOp, double> ops[] = {
      {UnaryOp::Neg, 0},        {UnaryOp::Exp, 0},          {UnaryOp::Log, 0},
      {UnaryOp::Tanh, 0},       {UnaryOp::Sqrt, 0},         {UnaryOp::PowScalar, 2.5},
      {UnaryOp::PowScalar, -1}, {UnaryOp::AddScalar, 0.75}, {UnaryOp::MulScalar, -3.0}};
  for (DType dt : {DType::F32, DType::BF16}) {
    for (auto [op, scalar] : ops) {
      for (int64_t n : {1, 7, 1000, 1023, 65537}) {
        for (int64_t off : {0, 1}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " op " << static_cast<int>(op) << " n " << n
                                            << " offset " << off);
          const bool positive = op == UnaryOp::Log || op == UnaryOp::Sqrt || op == UnaryOp::PowScalar;
          const HostBuf a(dt, uniform_vals(n + off, gen, positive ? 0.1 : -3.0, 3.0));
          const size_t es = dtype_size(dt);
          HostBuf ref(dt, n);
          cpu::unary(op, dt, static_cast<const unsigned char*>(a.data()) + off * es, ref.data(), n, scalar);
          DevBuf da(a), dout(static_cast<size_t>(n + off) * es);
          dout.poison();
          cuda::unary(op, dt, da.as<unsigned char>() + off * es, dout.as<unsigned char>() + off * es, n,
                      scalar, nullptr);
          const std::vector<double> all = dout.to_host(dt, n + off).vals();
          const std::vector<double> got(all.begin() + off, all.end());
          BT_EXPECT_REL(got, ref.vals(), tol(dt), "unary");
        }
      }
    }
  }
}

TEST(CudaElementwise, RejectsF64AndShapeMismatch) {
  BT_SKIP_WITHOUT_GPU();
  DevBuf d(64);
  const StridedLayout l = layout({4}, {1}), l5 = layout({5}, {1});
  EXPECT_THROW(cuda::binary(BinaryOp::Add, DType::F64, d.get(), l, d.get(), l, d.get(), nullptr), bt::Error);
  EXPECT_THROW(cuda::binary(BinaryOp::Add, DType::F32, d.get(), l, d.get(), l5, d.get(), nullptr), bt::Error);
  EXPECT_THROW(cuda::unary(UnaryOp::Exp, DType::F64, d.get(), d.get(), 4, 0.0, nullptr), bt::Error);
}

}  // namespace
}  // namespace bt::test::gpu
