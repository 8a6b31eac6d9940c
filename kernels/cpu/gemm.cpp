// CPU GEMM on OpenBLAS (row-major), batched by looping over the batch.
// F32 -> sgemm, F64 -> dgemm, BF16 -> float copies of A, B (and C when beta != 0),
// sgemm into a float C, epilogue in float, one rounding on store; with an F32
// C (c_dtype) the sgemm writes, or accumulates into, C itself. The
// epilogue and the bf16 copies run on the kernels' pool (parallel.h).
// F32 with GemmMath::Tf32x3 is the CUDA path's numerics (Note [3xTF32] in
// kernels/gemm.h): the operands split into their TF32 parts, three copies
// along K, and one sgemm over 3K, so the CPU is the reference for the GPU and
// for CI. GemmMath::Tf32 computes strict fp32 here.
//
// OpenBLAS and the pool. GEMM keeps OpenBLAS's own threads: its partitioning
// of one GEMM is faster than splitting it into separate calls here. But an
// OpenBLAS (pthreads build) worker busy-waits, calling sched_yield, for 2^28
// TSC ticks (~0.1 s) after every GEMM before it sleeps, and the kernels that
// run between GEMMs now use every core, so the spinning workers took CPU from
// them (on 2 cores: ~1400 vs ~1600 tokens/s for the tiny GPT-2).
// openblas_set_num_threads() does not stop a spinning worker; the spin time
// comes from OPENBLAS_THREAD_TIMEOUT (2^value ticks), which OpenBLAS reads when
// it starts its workers, at load time. So at program start, unless the user
// set that variable, shorten_openblas_spin() sets it to kSpinLog2 for
// OpenBLAS to re-read, stops OpenBLAS's workers (the next GEMM starts them
// again, now with the short spin) and removes the variable again, so child
// processes do not inherit it. The OpenBLAS entry points it needs are weak:
// with a BLAS that lacks them it does nothing.
#include "kernels/gemm.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cblas.h>

#include "kernels/common/tf32.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/parallel.h"
#include "kernels/reduce.h"

extern "C" {
void openblas_read_env(void) __attribute__((weak));
int blas_thread_shutdown_(void) __attribute__((weak));
}

namespace bt::kernels::cpu {
namespace {

constexpr const char* kSpinEnv = "OPENBLAS_THREAD_TIMEOUT";
constexpr const char* kSpinLog2 = "16";  // 2^16 TSC ticks: ~25 us at 2.5 GHz

/// See "OpenBLAS and the pool" above. Runs during static initialization, while
/// the process has no thread that could read the environment concurrently.
bool shorten_openblas_spin() {
  if (openblas_read_env == nullptr || blas_thread_shutdown_ == nullptr) return false;
  if (openblas_get_parallel() != 1 || std::getenv(kSpinEnv) != nullptr) return false;  // 1: pthreads
  if (setenv(kSpinEnv, kSpinLog2, 0) != 0) return false;
  openblas_read_env();
  unsetenv(kSpinEnv);
  blas_thread_shutdown_();
  return true;
}

[[maybe_unused]] const bool g_openblas_spin_shortened = shorten_openblas_spin();

using detail::acc_t;
using detail::load;
using detail::store;

void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda),
              b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
               const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda),
              b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

/// C = alpha * op(A) op(B) + beta * C on compute-type buffers. k == 0 is done
/// here (BLAS would reject lda < 1); beta == 0 never reads C.
template <class A>
void gemm_acc(const GemmArgs& g, const A* a, int64_t lda, const A* b, int64_t ldb, A* c, int64_t ldc) {
  if (g.k > 0) {
    blas_gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, static_cast<A>(g.alpha), a, lda, b, ldb,
              static_cast<A>(g.beta), c, ldc);
    return;
  }
  for (int64_t r = 0; r < g.m; ++r)
    for (int64_t j = 0; j < g.n; ++j)
      c[r * ldc + j] = g.beta == 0.0f ? A(0) : static_cast<A>(g.beta) * c[r * ldc + j];
}

/// Applies the epilogue to the m x n matrix src (compute type, leading dim lds)
/// and stores it to dst (ldc); pre (ldc) receives the pre-GELU values. DGelu
/// multiplies by the derivative at gelu_in (Note [GELU-gradient epilogue]).
template <class T, class A = acc_t<T>>
void epilogue(const GemmArgs& g, const A* src, int64_t lds, T* dst, T* pre) {
  const T* bias = static_cast<const T*>(g.bias);
  const T* gelu_in = static_cast<const T*>(g.gelu_in);
  const bool add_bias = g.epilogue == Epilogue::Bias || g.epilogue == Epilogue::BiasGelu;
  const bool gelu = g.epilogue == Epilogue::Gelu || g.epilogue == Epilogue::BiasGelu;
  const bool dgelu = is_dgelu(g.epilogue);
  parallel_for(0, g.m, grain_for(gelu || dgelu ? 8 * g.n : g.n), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      for (int64_t j = 0; j < g.n; ++j) {
        A v = src[r * lds + j];
        if (add_bias) v += load(bias, j);
        if (gelu) {
          if (pre) store(pre, r * g.ldc + j, v);
          v = detail::gelu_tanh(v);
        }
        if (dgelu) v = v * detail::gelu_tanh_grad(load(gelu_in, r * g.ld_gelu_in + j));
        store(dst, r * g.ldc + j, v);
      }
    }
  });
}

/// Copies the rows x cols matrix x (leading dim ld) to a packed float buffer.
void to_float(const bf16* x, int64_t rows, int64_t cols, int64_t ld, std::vector<float>& out) {
  out.resize(static_cast<size_t>(rows * cols));
  parallel_for(0, rows, grain_for(cols), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r)
      for (int64_t j = 0; j < cols; ++j) out[r * cols + j] = load(x, r * ld + j);
  });
}

/// Note [3xTF32]: the rows x cols matrix x (leading dim ld) as three copies
/// along K, each holding x's big or small TF32 parts (kX3SmallA/B), packed into
/// dst. K runs along x's columns (each row becomes [seg 0 | seg 1 | seg 2],
/// ld 3 cols) or along its rows (the segments stacked, ld cols).
void split_x3(const float* x, int64_t rows, int64_t cols, int64_t ld, bool k_along_cols, const bool small[3],
              std::vector<float>& dst) {
  dst.resize(static_cast<size_t>(3 * rows * cols));
  parallel_for(0, rows, grain_for(4 * cols), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r)
      for (int64_t j = 0; j < cols; ++j) {
        const Tf32Split p = split_tf32(x[r * ld + j]);
        for (int s = 0; s < 3; ++s) {
          const int64_t at = k_along_cols ? r * 3 * cols + s * cols + j : (s * rows + r) * cols + j;
          dst[static_cast<size_t>(at)] = small[s] ? p.small : p.big;
        }
      }
  });
}

/// F32, Tf32x3, k > 0: C = alpha (A_small B_big + A_big B_small + A_big B_big)
/// + beta C for every batch item, as one sgemm over 3K each. An operand with
/// batch stride 0 is split once.
void gemm_tf32x3(const GemmArgs& g, const float* A, const float* B, float* C) {
  const int64_t ar = g.trans_a ? g.k : g.m, ac = g.trans_a ? g.m : g.k;  // stored shape of A
  const int64_t br = g.trans_b ? g.n : g.k, bc = g.trans_b ? g.k : g.n;
  std::vector<float> a3, b3;
  for (int64_t i = 0; i < g.batch; ++i) {
    if (i == 0 || g.stride_a != 0) split_x3(A + i * g.stride_a, ar, ac, g.lda, !g.trans_a, kX3SmallA, a3);
    if (i == 0 || g.stride_b != 0) split_x3(B + i * g.stride_b, br, bc, g.ldb, g.trans_b, kX3SmallB, b3);
    blas_gemm(g.trans_a, g.trans_b, g.m, g.n, 3 * g.k, g.alpha, a3.data(), g.trans_a ? g.m : 3 * g.k,
              b3.data(), g.trans_b ? 3 * g.k : g.n, g.beta, C + i * g.stride_c, g.ldc);
  }
}

template <class T>
void gemm_impl(const GemmArgs& g, bool c_f32) {
  const T* A = static_cast<const T*>(g.a);
  const T* B = static_cast<const T*>(g.b);
  T* C = static_cast<T*>(g.c);
  T* P = static_cast<T*>(g.pre_gelu);
  const bool use_pre = g.pre_gelu && (g.epilogue == Epilogue::Gelu || g.epilogue == Epilogue::BiasGelu);
  if constexpr (std::is_same_v<T, bf16>) {
    const int64_t ar = g.trans_a ? g.k : g.m, ac = g.trans_a ? g.m : g.k;
    const int64_t br = g.trans_b ? g.n : g.k, bc = g.trans_b ? g.k : g.n;
    std::vector<float> af, bfl, cf(c_f32 ? 0 : static_cast<size_t>(g.m * g.n));
    for (int64_t i = 0; i < g.batch; ++i) {
      to_float(A + i * g.stride_a, ar, ac, g.lda, af);
      to_float(B + i * g.stride_b, br, bc, g.ldb, bfl);
      if (c_f32) {  // no epilogue (gemm_c_dtype): the product goes straight into C
        gemm_acc<float>(g, af.data(), std::max<int64_t>(ac, 1), bfl.data(), std::max<int64_t>(bc, 1),
                        static_cast<float*>(g.c) + i * g.stride_c, g.ldc);
        continue;
      }
      T* c = C + i * g.stride_c;
      if (g.beta == 0.0f)
        std::fill(cf.begin(), cf.end(), 0.0f);
      else
        for (int64_t r = 0; r < g.m; ++r)
          for (int64_t j = 0; j < g.n; ++j) cf[r * g.n + j] = load(c, r * g.ldc + j);
      gemm_acc<float>(g, af.data(), std::max<int64_t>(ac, 1), bfl.data(), std::max<int64_t>(bc, 1), cf.data(),
                      std::max<int64_t>(g.n, 1));
      epilogue<T>(g, cf.data(), g.n, c, use_pre ? P + i * g.stride_c : nullptr);
    }
  } else {
    const bool x3 = std::is_same_v<T, float> && g.math == GemmMath::Tf32x3 && g.k > 0;
    if constexpr (std::is_same_v<T, float>) {
      if (x3) gemm_tf32x3(g, A, B, C);
    }
    for (int64_t i = 0; i < g.batch; ++i) {
      T* c = C + i * g.stride_c;
      if (!x3) gemm_acc<T>(g, A + i * g.stride_a, g.lda, B + i * g.stride_b, g.ldb, c, g.ldc);
      if (g.epilogue != Epilogue::None) epilogue<T>(g, c, g.ldc, c, use_pre ? P + i * g.stride_c : nullptr);
    }
  }
}

void check_args(const GemmArgs& g) {
  BT_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 0, "gemm: negative size (m=", g.m, ", n=", g.n,
           ", k=", g.k, ", batch=", g.batch, ")");
  const int64_t a_cols = g.trans_a ? g.m : g.k, b_cols = g.trans_b ? g.k : g.n;
  BT_CHECK(g.lda >= std::max<int64_t>(a_cols, 1) || g.k == 0, "gemm: lda=", g.lda, " is smaller than ",
           "the ", a_cols, " columns of the row-major A", g.trans_a ? " (trans_a)" : "");
  BT_CHECK(g.ldb >= std::max<int64_t>(b_cols, 1) || g.k == 0, "gemm: ldb=", g.ldb, " is smaller than ",
           "the ", b_cols, " columns of the row-major B", g.trans_b ? " (trans_b)" : "");
  BT_CHECK(g.ldc >= std::max<int64_t>(g.n, 1), "gemm: ldc=", g.ldc, " is smaller than n=", g.n);
  for (int64_t v : {g.m, g.n, g.k, g.lda, g.ldb, g.ldc})
    BT_CHECK(v <= INT_MAX, "gemm: dimension or leading dimension ", v, " exceeds the BLAS int range");
  BT_CHECK(g.epilogue == Epilogue::None || g.epilogue == Epilogue::Bias || g.epilogue == Epilogue::Gelu ||
               g.epilogue == Epilogue::BiasGelu || is_dgelu(g.epilogue),
           "gemm: unknown epilogue ", static_cast<int>(g.epilogue));
  check_dgelu(g, "gemm");
  BT_CHECK(g.epilogue != Epilogue::Bias || g.beta == 0.0f,
           "gemm: the Bias epilogue requires beta == 0 (got beta=", g.beta,
           "); add the bias separately when accumulating into C");
  const bool needs_bias = g.epilogue == Epilogue::Bias || g.epilogue == Epilogue::BiasGelu;
  BT_CHECK(!needs_bias || g.bias != nullptr, "gemm: the Bias/BiasGelu epilogue needs a bias pointer");
  if (g.batch > 0 && g.m > 0 && g.n > 0) {
    BT_CHECK(g.c != nullptr, "gemm: C is null");
    BT_CHECK(g.k == 0 || (g.a != nullptr && g.b != nullptr), "gemm: A or B is null");
  }
}

}  // namespace

void gemm(const GemmArgs& args) {
  check_args(args);
  const DType c_dt = gemm_c_dtype(args, "gemm");
  const BiasGradDims d = args.bias_grad ? bias_grad_dims(args, "gemm") : BiasGradDims{nullptr, 0, 0, 0};
  const DType bg_dt = gemm_bias_grad_dtype(args, c_dt, "gemm");
  detail::dispatch_float(args.dtype, "gemm", [&]<class T>(std::type_identity<T>) {
    if (args.batch == 0 || args.m == 0 || args.n == 0) return;
    gemm_impl<T>(args, c_dt != args.dtype);
  });
  // Note [Fused bias gradient]: op(A) summed over k, or for DGeluBgrad the
  // stored C over its rows (Note [GELU-gradient epilogue]).
  if (args.bias_grad && d.outer * d.inner > 0) {
    if (d.dim == 0)
      std::memset(args.bias_grad, 0, static_cast<size_t>(d.outer * d.inner) * dtype_size(bg_dt));
    else
      reduce_dim(ReduceOp::Sum, args.dtype, bg_dt, d.in, args.bias_grad, d.outer, d.dim, d.inner);
  }
}

}  // namespace bt::kernels::cpu
