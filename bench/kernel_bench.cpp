// bt_kernel_bench: BluTrain CUDA kernels against their ceilings, in one run.
//
//   GEMM 4096^3 (bf16, strict f32, f32+tf32): cuda::gemm (cuBLASLt) vs
//     cuda::cublas_reference_gemm (plain cuBLAS), TFLOP/s; f32 3xTF32 (the
//     fp32x3 precision, split included) against plain cuBLAS's strict SGEMM,
//     in fp32 TFLOP/s (2 N^3 per GEMM, not the 3 TF32 products); then every
//     math on GPT-2 124M's MLP shapes (forward, input and weight gradients).
//   Device-to-device copy (cudaMemcpyAsync) at 64 and 256 MiB: the bandwidth
//     ceiling, counting bytes read + written.
//   LayerNorm forward (f32, bf16), a bias gradient's column sums (bf16 into
//     f32) and AdamW (f32 grads) in GB/s, as a fraction of the copy bandwidth
//     measured in the same run at the same size.
//   With MLIR 19 (BT_MLIR), the compiler's generated kernels (Note [CUDA
//     templates]) at the same sizes, from fusion groups written as the
//     primitive-op model records them: bias + GELU (pointwise), LayerNorm
//     forward (rows; next to the hand kernel's row), a bias gradient (column
//     sums) and a squared norm (a whole-tensor sum). Bytes counted: the big
//     tensor read, plus written where the kernel writes one.
//   Causal attention, bf16 (the Hopper wgmma kernels where there are, and
//     the mma.sync kernels) and f32 (strict, TF32 and 3xTF32 products), GPT-2
//     124M shape (B 16, H 12, T 1024, D 64; q/k/v strided slices of a fused
//     [B, T, 3, H, D] buffer), forward and backward in TFLOP/s: the fast path
//     (bf16 and TF32 math: tensor cores; strict f32: the register-tiled FFMA
//     kernels) against PyTorch's best SDPA backend for that dtype and
//     direction (f32: its memory-efficient kernel, 3xTF32 on sm_80 and later),
//     timed in the same run by the reference script (`gpt2_ref.py attention`:
//     flash, memory-efficient and cuDNN, on q/k/v views of the same fused
//     layout). Without torch, against the
//     one-row-per-lane SIMT kernel the fast paths replaced (reached by a
//     t-stride of 3HD + 1, whose unaligned rows they decline). Causal FLOPs:
//     forward 2 B H T^2 D, backward 2.5x that.
//
// Timing: CUDA events around each repetition, after warm-up; the median of
// >= 20 repetitions; inputs are random (never zeros).
//
//   bt_kernel_bench [--quick] [--markdown PATH] [--python PY] [--reference-script PATH | --no-reference]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/common/cuda_check.h"
#include "kernels/common/dtype.h"
#include "kernels/gelu.h"
#include "kernels/gemm.h"
#include "kernels/layernorm.h"
#include "kernels/random.h"
#include "kernels/reduce.h"
#ifdef BT_MLIR
#include "compiler/mlir_backend.h"
#include "runtime/core/stream.h"
#include "runtime/tensor/factory.h"
#include "tests/support/fusion_groups.h"
#endif

namespace {
namespace cuda = bt::kernels::cuda;
using bt::DType;

struct Options {
  bool quick = false;
  std::string markdown;
  std::string command_line;
  std::string python = "python3";
  std::string reference = "bench/gpt2_ref.py";  // empty: no PyTorch reference
  std::string only;                             // empty: every section; else gemm, attention or memory
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 0; i < argc; ++i) o.command_line += (i ? " " : "") + std::string(argv[i]);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      o.quick = true;
    } else if (a == "--markdown" && i + 1 < argc) {
      o.markdown = argv[++i];
    } else if (a == "--python" && i + 1 < argc) {
      o.python = argv[++i];
    } else if (a == "--reference-script" && i + 1 < argc) {
      o.reference = argv[++i];
    } else if (a == "--no-reference") {
      o.reference.clear();
    } else if (a == "--only" && i + 1 < argc) {
      o.only = argv[++i];
      if (o.only != "gemm" && o.only != "attention" && o.only != "memory") {
        std::cerr << "bt_kernel_bench: --only takes gemm, attention or memory, got '" << o.only << "'\n";
        std::exit(2);
      }
    } else if (a == "--help" || a == "-h") {
      std::cout << "usage: bt_kernel_bench [--quick] [--markdown PATH] [--python PY] "
                   "[--reference-script PATH | --no-reference] [--only gemm|attention|memory]\n";
      std::exit(0);
    } else {
      std::cerr << "bt_kernel_bench: unknown argument '" << a
                << "' (use --quick, --markdown PATH, --python PY, --reference-script PATH, --no-reference, "
                   "--only SECTION)\n";
      std::exit(2);
    }
  }
  return o;
}

/// Device buffer that frees itself.
struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) { BT_CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

class Timer {
 public:
  Timer(int warmup, int reps) : warmup_(warmup), reps_(reps) {
    BT_CUDA_CHECK(cudaEventCreate(&start_));
    BT_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~Timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  /// Median milliseconds of one call of fn (queued on `stream`).
  double median_ms(const std::function<void()>& fn, cudaStream_t stream) {
    for (int i = 0; i < warmup_; ++i) fn();
    BT_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<double> t;
    t.reserve(static_cast<size_t>(reps_));
    for (int i = 0; i < reps_; ++i) {
      BT_CUDA_CHECK(cudaEventRecord(start_, stream));
      fn();
      BT_CUDA_CHECK(cudaEventRecord(stop_, stream));
      BT_CUDA_CHECK(cudaEventSynchronize(stop_));
      float ms = 0.0f;
      BT_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    const size_t n = t.size();
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
  }

 private:
  int warmup_, reps_;
  cudaEvent_t start_{}, stop_{};
};

struct Row {
  std::string kernel, size, unit;
  double ours, ceiling;
  std::string ceiling_name;
};

std::string fmt(double v, int prec) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(prec);
  os << v;
  return os.str();
}

std::string mib(size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

void fill_random(DType dt, void* p, int64_t n, uint64_t seed, float lo, float hi, cudaStream_t s) {
  cuda::fill_uniform(dt, p, n, seed, 0, lo, hi, s);
}

// ---------------------------------------------------------------- GEMM
/// One GEMM math (dtype and GemmMath), with a name for the table.
struct GemmCfg {
  DType dt;
  bt::kernels::GemmMath math;
  const char* name;
};

/// A GEMM problem: m x n x k with A and B read transposed or not.
struct GemmShape {
  const char* name;
  int64_t m, n, k;
  bool ta, tb;
};

/// `c` on `sh` against plain cuBLAS on the same layout (fp32x3 against strict
/// SGEMM, the ceiling it has to beat), in TFLOP/s of the product (2 m n k,
/// not fp32x3's three TF32 products).
Row gemm_row(Timer& timer, cudaStream_t s, const GemmCfg& c, const GemmShape& sh, const std::string& kernel) {
  using bt::kernels::GemmMath;
  const size_t es = bt::dtype_size(c.dt);
  Dev a(sh.m * sh.k * es), b(sh.k * sh.n * es), out(sh.m * sh.n * es);
  fill_random(c.dt, a.p, sh.m * sh.k, 1, -1.0f, 1.0f, s);
  fill_random(c.dt, b.p, sh.k * sh.n, 2, -1.0f, 1.0f, s);
  bt::kernels::GemmArgs g;
  g.dtype = c.dt;
  g.m = sh.m, g.n = sh.n, g.k = sh.k, g.trans_a = sh.ta, g.trans_b = sh.tb;
  g.lda = sh.ta ? sh.m : sh.k, g.ldb = sh.tb ? sh.k : sh.n, g.ldc = sh.n;
  g.a = a.p, g.b = b.p, g.c = out.p;
  g.math = c.math;
  Dev scratch(std::max<size_t>(cuda::gemm_scratch_floats(g), 1) * sizeof(float));
  const double ours = timer.median_ms([&] { cuda::gemm(g, s, scratch.as<float>()); }, s);
  const bool x3 = c.math == GemmMath::Tf32x3;
  bt::kernels::GemmArgs ref = g;
  if (x3) ref.math = GemmMath::Strict;
  const double theirs = timer.median_ms([&] { cuda::cublas_reference_gemm(ref, s); }, s);
  const double flops = 2.0 * sh.m * sh.n * sh.k;
  return {cuda::gemm_uses_dmma(g) ? kernel + " [FP64 tensor cores]" : kernel,
          std::to_string(sh.m) + "x" + std::to_string(sh.n) + "x" + std::to_string(sh.k),
          "TFLOP/s",
          flops / (ours * 1e-3) / 1e12,
          flops / (theirs * 1e-3) / 1e12,
          x3 ? "cuBLAS strict SGEMM" : "cuBLAS"};
}

const GemmCfg kGemmCfgs[] = {{DType::BF16, bt::kernels::GemmMath::Strict, "bf16"},
                             {DType::F32, bt::kernels::GemmMath::Strict, "f32"},
                             {DType::F32, bt::kernels::GemmMath::Tf32, "f32 + tf32"},
                             {DType::F32, bt::kernels::GemmMath::Tf32x3, "f32 3xTF32"}};

/// 4096^3 in every math: the square the GEMM targets are set on.
void bench_gemm(Timer& timer, cudaStream_t s, std::vector<Row>& rows) {
  const char* names[] = {"GEMM bf16", "GEMM f32 (strict)", "GEMM f32 + tf32", "GEMM f32 3xTF32 (fp32x3)"};
  for (int i = 0; i < 4; ++i)
    rows.push_back(gemm_row(timer, s, kGemmCfgs[i], {"", 4096, 4096, 4096, false, false}, names[i]));
}

/// GPT-2 124M's MLP GEMMs (16384 tokens, 768 -> 3072): the forward, the input
/// gradient and the weight gradient (a transposed A over K = 16384), in every
/// GEMM math: whether cuBLASLt's heuristic picks as well as cuBLAS does on the
/// shapes training runs, not only on a square.
void bench_gemm_gpt2_shapes(Timer& timer, cudaStream_t s, std::vector<Row>& rows) {
  const int64_t M = 16384, C = 768, F = 3072;
  for (const GemmCfg& c : kGemmCfgs)
    for (const GemmShape& sh :
         {GemmShape{"fwd x W^T", M, F, C, false, true}, GemmShape{"dX = dY W", M, C, F, false, false},
          GemmShape{"dW = dY^T X", F, C, M, true, false}})
      rows.push_back(gemm_row(timer, s, c, sh, std::string("GEMM ") + c.name + ", GPT-2 MLP " + sh.name));
}

// ---------------------------------------------------------------- bandwidth
#ifdef BT_MLIR
/// GB/s of fusion group `g` compiled for the GPU (random inputs, fresh
/// outputs), counting `moved` bytes per call.
double generated_gbps(Timer& timer, cudaStream_t s, const bt::fusion::Group& g, double moved) {
  const bt::Device gpu = bt::Device::cuda(0);
  const auto kernel = bt::compiler::make_mlir_backend()->compile(g, gpu);
  std::vector<bt::Tensor> in, out;
  uint64_t seed = 11;
  for (int n : g.inputs()) {
    in.push_back(bt::empty(g.nodes[n].shape, bt::TensorOptions{g.nodes[n].dtype, gpu}));
    fill_random(g.nodes[n].dtype, in.back().data_ptr(), in.back().numel(), seed++, 0.5f, 2.0f, s);
  }
  for (int o : g.outputs)
    out.push_back(bt::empty(g.nodes[o].shape, bt::TensorOptions{g.nodes[o].dtype, gpu}));
  bt::StreamGuard guard(bt::Stream(gpu, s));
  const double ms = timer.median_ms([&] { kernel->run(in, out); }, s);
  return moved / (ms * 1e-3) / 1e9;
}

void bench_generated(Timer& timer, cudaStream_t s, size_t bytes, double copy, std::vector<Row>& rows) {
  namespace t = bt::test;
  const int64_t cols = 768;
  const auto b = static_cast<double>(bytes);
  for (DType dt : {DType::F32, DType::BF16}) {
    const std::string d(bt::dtype_name(dt));
    const int64_t r = static_cast<int64_t>(bytes / bt::dtype_size(dt)) / cols;
    const std::string size = mib(bytes) + " x";
    rows.push_back({"generated bias + GELU " + d, size, "GB/s",
                    generated_gbps(timer, s, t::bias_gelu_group(dt, r, cols), 2 * b), copy, "D2D copy"});
    rows.push_back({"generated LayerNorm fwd " + d + ", cols 768", size, "GB/s",
                    generated_gbps(timer, s, t::layer_norm_group(dt, r, cols), 2 * b), copy, "D2D copy"});
    rows.push_back({"generated bias grad (column sums) " + d, size, "GB/s",
                    generated_gbps(timer, s, t::bias_grad_group(dt, {r, cols}), b), copy, "D2D copy"});
  }
  rows.push_back(
      {"generated squared norm f32", mib(bytes) + " x", "GB/s",
       generated_gbps(timer, s, bt::test::square_norm_group(static_cast<int64_t>(bytes / 4) / cols, cols), b),
       copy, "D2D copy"});
}
#endif

double copy_gbps(Timer& timer, cudaStream_t s, size_t bytes) {
  Dev src(bytes), dst(bytes);
  fill_random(DType::F32, src.p, static_cast<int64_t>(bytes / 4), 3, -1.0f, 1.0f, s);
  const double ms = timer.median_ms(
      [&] { BT_CUDA_CHECK(cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, s)); }, s);
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

double layernorm_gbps(Timer& timer, cudaStream_t s, DType dt, size_t x_bytes, int64_t cols) {
  const size_t es = bt::dtype_size(dt);
  const int64_t rows = static_cast<int64_t>(x_bytes / es) / cols;
  Dev x(x_bytes), y(x_bytes), w(cols * es), b(cols * es), mean(rows * 4), rstd(rows * 4);
  fill_random(dt, x.p, rows * cols, 4, -2.0f, 2.0f, s);
  fill_random(dt, w.p, cols, 5, 0.5f, 1.5f, s);
  fill_random(dt, b.p, cols, 6, -0.5f, 0.5f, s);
  const double ms = timer.median_ms(
      [&] {
        cuda::layernorm_forward(dt, x.p, w.p, b.p, y.p, mean.as<float>(), rstd.as<float>(), rows, cols, 1e-5f,
                                s);
      },
      s);
  const double bytes = 2.0 * static_cast<double>(rows * cols * es) + 2.0 * cols * es + 2.0 * rows * 4;
  return bytes / (ms * 1e-3) / 1e9;
}

/// The backward of add_layer_norm as GPT-2 runs it: dx = LN'(dy) + dres, and
/// the f32 weight and bias gradients (f32 parameters under bf16). Counts the
/// reads of dy, x and dres, the write of dx, and w, dw, db.
double layernorm_backward_gbps(Timer& timer, cudaStream_t s, DType dt, size_t x_bytes, int64_t cols) {
  const size_t es = bt::dtype_size(dt);
  const int64_t rows = static_cast<int64_t>(x_bytes / es) / cols;
  const bt::kernels::LnTypes t =
      dt == DType::BF16 ? bt::kernels::LnTypes(dt, DType::F32, DType::F32) : bt::kernels::LnTypes(dt);
  const size_t ps = bt::dtype_size(t.w);
  Dev x(x_bytes), dy(x_bytes), dres(x_bytes), dx(x_bytes), w(cols * ps), dw(cols * ps), db(cols * ps),
      mean(rows * 4), rstd(rows * 4),
      scratch(cuda::layernorm_backward_scratch_floats(rows, cols) * sizeof(float));
  fill_random(dt, x.p, rows * cols, 11, -2.0f, 2.0f, s);
  fill_random(dt, dy.p, rows * cols, 12, -1.0f, 1.0f, s);
  fill_random(dt, dres.p, rows * cols, 13, -1.0f, 1.0f, s);
  fill_random(t.w, w.p, cols, 14, 0.5f, 1.5f, s);
  fill_random(DType::F32, mean.p, rows, 15, -0.1f, 0.1f, s);
  fill_random(DType::F32, rstd.p, rows, 16, 0.9f, 1.1f, s);
  const double ms = timer.median_ms(
      [&] {
        cuda::layernorm_backward(t, dy.p, x.p, w.p, mean.as<float>(), rstd.as<float>(), dx.p, dw.p, db.p,
                                 rows, cols, scratch.as<float>(), s, dres.p);
      },
      s);
  const double bytes = 4.0 * static_cast<double>(rows * cols * es) + 3.0 * cols * ps + 2.0 * rows * 4;
  return bytes / (ms * 1e-3) / 1e9;
}

/// The MLP's GELU backward in one pass (Note [The MLP's GELU backward in one
/// pass]) on rows x cols of dt: dH becomes dPre, h is rebuilt, dPre's columns
/// summed into f32. Counts the reads of pre and dH and the writes of dPre and h.
double gelu_backward_fused_gbps(Timer& timer, cudaStream_t s, DType dt, int64_t rows, int64_t cols) {
  const size_t n = static_cast<size_t>(rows * cols), es = bt::dtype_size(dt);
  Dev pre(n * es), g(n * es), h(n * es), sums(static_cast<size_t>(cols) * 4),
      scratch(std::max<size_t>(cuda::gelu_backward_fused_scratch_floats(rows, cols), 1) * 4);
  fill_random(dt, pre.p, rows * cols, 18, -3.0f, 3.0f, s);
  fill_random(dt, g.p, rows * cols, 19, -1.0f, 1.0f, s);
  const double ms = timer.median_ms(
      [&] {
        cuda::gelu_backward_fused(dt, pre.p, g.p, h.p, sums.as<float>(), rows, cols, scratch.as<float>(), s);
      },
      s);
  return 4.0 * static_cast<double>(n * es) / (ms * 1e-3) / 1e9;
}

/// A bias gradient: the column sums of `bytes` of dt rows of `cols`, into f32
/// (the split pass, as gemm's bias_grad_sum runs it); bytes read per second.
double column_sums_gbps(Timer& timer, cudaStream_t s, DType dt, size_t bytes, int64_t cols) {
  const int64_t rows = static_cast<int64_t>(bytes / bt::dtype_size(dt)) / cols;
  Dev x(static_cast<size_t>(rows * cols) * bt::dtype_size(dt)), out(static_cast<size_t>(cols) * 4);
  Dev scratch(
      std::max<size_t>(cuda::reduce_dim_scratch_floats(bt::kernels::ReduceOp::Sum, 1, rows, cols), 1) * 4);
  fill_random(dt, x.p, rows * cols, 17, -1.0f, 1.0f, s);
  const double ms = timer.median_ms(
      [&] {
        cuda::reduce_dim(bt::kernels::ReduceOp::Sum, dt, DType::F32, x.p, out.p, 1, rows, cols,
                         scratch.as<float>(), s);
      },
      s);
  return static_cast<double>(rows * cols) * static_cast<double>(bt::dtype_size(dt)) / (ms * 1e-3) / 1e9;
}

double adamw_gbps(Timer& timer, cudaStream_t s, size_t param_bytes) {
  const int64_t n = static_cast<int64_t>(param_bytes / 4);
  Dev p(param_bytes), g(param_bytes), m(param_bytes), v(param_bytes);
  fill_random(DType::F32, p.p, n, 7, -1.0f, 1.0f, s);
  fill_random(DType::F32, g.p, n, 8, -0.1f, 0.1f, s);
  fill_random(DType::F32, m.p, n, 9, -0.01f, 0.01f, s);
  fill_random(DType::F32, v.p, n, 10, 0.0f, 1e-4f, s);
  bt::kernels::AdamWArgs a;
  a.param = p.as<float>();
  a.grad = g.p;
  a.grad_dt = DType::F32;
  a.m = m.as<float>();
  a.v = v.as<float>();
  a.n = n;
  a.lr = 1e-4f, a.weight_decay = 0.1f, a.bias1 = 0.1f, a.bias2 = 0.001f;
  const double ms = timer.median_ms([&] { cuda::adamw(a, s); }, s);
  const double bytes = 7.0 * static_cast<double>(param_bytes);  // read p, g, m, v; write p, m, v
  return bytes / (ms * 1e-3) / 1e9;
}

// ---------------------------------------------------------------- attention
/// PyTorch SDPA's times at the same shape (`gpt2_ref.py attention`, one JSON
/// line: {dtype: {backend: {fwd_ms, bwd_ms} | {error}}}), or null with the
/// reason on stderr when the reference cannot run (no torch, no script).
nlohmann::json sdpa_times(const Options& opt) {
  if (opt.reference.empty()) return nullptr;
  const std::string cmd = opt.python + " '" + opt.reference + "' attention --warmup " +
                          std::to_string(opt.quick ? 3 : 10) + " --reps " +
                          std::to_string(opt.quick ? 20 : 50) + " 2>&1";
  std::cout << "reference: " << cmd << "\n" << std::flush;
  FILE* p = popen(cmd.c_str(), "r");
  std::string out, last_json;
  char buf[4096];
  while (p && std::fgets(buf, sizeof buf, p)) {
    out += buf;
    if (buf[0] == '{') last_json = buf;
  }
  const int st = p ? pclose(p) : -1;
  if (st != 0 || last_json.empty()) {
    std::cerr << "bt_kernel_bench: the PyTorch attention reference failed (status " << st
              << "); attention is compared with the old SIMT kernel. Its output:\n"
              << out;
    return nullptr;
  }
  return nlohmann::json::parse(last_json);
}

/// The fastest backend's time for `dir` ("fwd_ms" or "bwd_ms") in `res`
/// ({backend: {...}}): {ms, name}, or {0, ""} when none ran.
std::pair<double, std::string> best_backend(const nlohmann::json& res, const char* dir) {
  std::pair<double, std::string> best{0.0, ""};
  for (const auto& [name, r] : res.items())
    if (r.contains(dir) && (best.first == 0.0 || r.at(dir).get<double>() < best.first))
      best = {r.at(dir).get<double>(), name};
  return best;
}

void bench_attention(const Options& opt, Timer& timer, cudaStream_t s, std::vector<Row>& rows) {
  namespace k = bt::kernels;
  const int64_t B = 16, H = 12, T = 1024, D = 64;
  const k::AttnShape shape{B, H, T, D};
  const int64_t n = B * H * T * D;
  const double fwd_flops = 2.0 * B * H * T * T * D, bwd_flops = 2.5 * fwd_flops;
  const std::string size = "B16 H12 T1024 D64";
  const nlohmann::json sdpa = sdpa_times(opt);  // the same shape: gpt2_ref.py attention's defaults
  const auto tf = [](double flops, double t) { return flops / (t * 1e-3) / 1e12; };
  const struct {
    DType dt;
    k::GemmMath math;
    bool wgmma;  // the Hopper kernels, where this build and device have them
    const char* name;
  } variants[] = {{DType::BF16, k::GemmMath::Strict, true, "bf16 (causal, wgmma)"},
                  {DType::BF16, k::GemmMath::Strict, false, "bf16 (causal, mma.sync)"},
                  {DType::F32, k::GemmMath::Strict, false, "f32 (strict, causal)"},
                  {DType::F32, k::GemmMath::Tf32x3, false, "f32 (3xTF32, causal)"},
                  {DType::F32, k::GemmMath::Tf32, false, "f32 (TF32, causal)"}};
  const bool wgmma_was = k::cuda::attention_wgmma_enabled();
  for (const auto& var : variants) {
    if (var.wgmma && !k::cuda::attention_wgmma_available()) continue;
    k::cuda::set_attention_wgmma(var.wgmma);
    const DType dt = var.dt;
    const size_t es = bt::dtype_size(dt);
    // Contiguous o, dout and grads (as the runtime allocates them); lse. The
    // backward's scratch is what each call runs fastest with (as the runtime
    // gives it).
    Dev o(n * es), dout(n * es), dq(n * es), dk(n * es), dv(n * es), lse(B * H * T * 4);
    fill_random(dt, dout.p, n, 12, -1.0f, 1.0f, s);
    const k::AttnStrides so = k::contiguous_bhtd(shape);
    // t-stride of the fused qkv buffer: aligned rows (fast path), then unaligned (SIMT).
    const int64_t rows_of[2] = {3 * H * D, 3 * H * D + 1};
    double ms[2][2] = {};  // [path][fwd, bwd]
    for (int pi = 0; pi < 2; ++pi) {
      const int64_t row = rows_of[pi];
      Dev qkv(B * T * row * es);
      fill_random(dt, qkv.p, B * T * row, 11, -2.0f, 2.0f, s);
      const auto at = [&](int64_t off) { return qkv.as<unsigned char>() + off * es; };
      const k::AttnStrides sqkv{T * row, D, row};
      k::AttnForward f;
      f.dt = dt;
      f.math = var.math;
      f.shape = shape;
      f.scale = 0.125f;
      f.q = at(0), f.k = at(H * D), f.v = at(2 * H * D);
      f.sq = f.sk = f.sv = sqkv;
      f.o = o.p, f.so = so;
      f.lse = lse.as<float>();
      ms[pi][0] = timer.median_ms([&] { k::cuda::attention_forward(f, s); }, s);
      k::AttnBackward b;
      b.dt = dt;
      b.math = var.math;
      b.shape = shape;
      b.scale = f.scale;
      b.q = f.q, b.k = f.k, b.v = f.v;
      b.sq = b.sk = b.sv = sqkv;
      b.o = o.p, b.so = so;
      b.dout = dout.p, b.sdo = so;
      b.lse = lse.as<float>();
      b.dq = dq.p, b.dk = dk.p, b.dv = dv.p;
      b.sdq = b.sdk = b.sdv = so;
      const size_t floats = k::cuda::attention_backward_scratch_floats(b);
      Dev scratch(floats * 4);
      ms[pi][1] = timer.median_ms([&] { k::cuda::attention_backward(b, scratch.as<float>(), s, floats); }, s);
    }
    const std::string name = var.name;
    const char* key = dt == DType::F32 ? "f32" : "bf16";
    for (int d = 0; d < 2; ++d) {
      const double flops = d == 0 ? fwd_flops : bwd_flops;
      const auto [ref_ms, backend] = sdpa.is_object() && sdpa.contains(key)
                                         ? best_backend(sdpa.at(key), d == 0 ? "fwd_ms" : "bwd_ms")
                                         : std::pair<double, std::string>{0.0, ""};
      rows.push_back({std::string(d == 0 ? "Attention fwd " : "Attention bwd ") + name, size, "TFLOP/s",
                      tf(flops, ms[0][d]), ref_ms > 0 ? tf(flops, ref_ms) : tf(flops, ms[1][d]),
                      ref_ms > 0 ? "PyTorch SDPA (" + backend + ")" : "old SIMT kernel"});
    }
  }
  k::cuda::set_attention_wgmma(wgmma_was);
}

std::string table(const std::vector<Row>& rows) {
  std::ostringstream os;
  os << "| kernel | size | unit | BluTrain | ceiling | ceiling is | ratio |\n";
  os << "| --- | --- | --- | ---: | ---: | --- | ---: |\n";
  for (const Row& r : rows)
    os << "| " << r.kernel << " | " << r.size << " | " << r.unit << " | " << fmt(r.ours, 1) << " | "
       << fmt(r.ceiling, 1) << " | " << r.ceiling_name << " | " << fmt(r.ours / r.ceiling, 3) << " |\n";
  return os.str();
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  try {
    int dev = 0;
    BT_CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp prop{};
    BT_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    int runtime = 0, driver = 0;
    BT_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
    BT_CUDA_CHECK(cudaDriverGetVersion(&driver));
    std::ostringstream head;
    head << "# bt_kernel_bench\n\n"
         << "- command: `" << opt.command_line << "`\n"
         << "- device: " << prop.name << " (sm_" << prop.major << prop.minor << ", "
         << prop.multiProcessorCount << " SMs, " << (prop.totalGlobalMem >> 30) << " GiB)\n"
         << "- CUDA runtime " << runtime / 1000 << "." << (runtime % 1000) / 10 << ", driver "
         << driver / 1000 << "." << (driver % 1000) / 10 << "\n"
         << "- timing: CUDA events, median of " << (opt.quick ? 20 : 50) << " reps after "
         << (opt.quick ? 3 : 10) << " warm-up calls; random inputs\n\n";
    std::cout << head.str() << std::flush;

    cudaStream_t s = nullptr;
    BT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    Timer timer(opt.quick ? 3 : 10, opt.quick ? 20 : 50);
    std::vector<Row> rows;
    auto want = [&](const char* section) { return opt.only.empty() || opt.only == section; };
    if (want("gemm")) {
      bench_gemm(timer, s, rows);
      bench_gemm_gpt2_shapes(timer, s, rows);
    }
    if (want("attention")) bench_attention(opt, timer, s, rows);

    if (want("memory")) {
      // GPT-2 124M's LayerNorm backward as a step runs it: 16384 x 768 bf16
      // (24 MiB), against a copy of the same size.
      const size_t bytes = size_t{16384} * 768 * 2;
      const double copy = copy_gbps(timer, s, bytes);
      const double lb = layernorm_backward_gbps(timer, s, DType::BF16, bytes, 768);
      rows.push_back({"LayerNorm bwd + residual grad bf16, 16384 x 768 (GPT-2 124M)", mib(bytes) + " x",
                      "GB/s", lb, copy, "D2D copy"});
      const double gb = gelu_backward_fused_gbps(timer, s, DType::BF16, 16384, 3072);
      rows.push_back({"MLP GELU bwd in one pass (dPre, h, bias grad) bf16, 16384 x 3072 (GPT-2 124M)",
                      mib(size_t{16384} * 3072 * 2) + " x", "GB/s", gb, copy, "D2D copy"});
    }
    std::vector<size_t> sizes;
    if (want("memory")) sizes.push_back(size_t{64} << 20);
    if (want("memory") && !opt.quick) sizes.push_back(size_t{256} << 20);
    for (size_t bytes : sizes) {
      const double copy = copy_gbps(timer, s, bytes);
      rows.push_back({"D2D copy (read + write)", mib(bytes), "GB/s", copy, copy, "itself"});
      for (int64_t cols : {768, 1024}) {
        for (DType dt : {DType::F32, DType::BF16}) {
          const double ln = layernorm_gbps(timer, s, dt, bytes, cols);
          rows.push_back({std::string("LayerNorm fwd ") + std::string(bt::dtype_name(dt)) + ", cols " +
                              std::to_string(cols),
                          mib(bytes) + " x", "GB/s", ln, copy, "D2D copy"});
        }
      }
      for (DType dt : {DType::F32, DType::BF16}) {
        const double lb = layernorm_backward_gbps(timer, s, dt, bytes, 768);
        rows.push_back(
            {std::string("LayerNorm bwd + residual grad ") + std::string(bt::dtype_name(dt)) + ", cols 768",
             mib(bytes) + " x", "GB/s", lb, copy, "D2D copy"});
      }
      for (int64_t cols : {768, 3072}) {
        const double cs = column_sums_gbps(timer, s, DType::BF16, bytes, cols);
        rows.push_back({"bias grad (column sums) bf16 -> f32, cols " + std::to_string(cols),
                        mib(bytes) + " x", "GB/s", cs, copy, "D2D copy"});
      }
      const double ad = adamw_gbps(timer, s, bytes);
      rows.push_back({"AdamW (f32 grads)", mib(bytes) + " params", "GB/s", ad, copy, "D2D copy"});
#ifdef BT_MLIR
      bench_generated(timer, s, bytes, copy, rows);
#endif
    }
    BT_CUDA_CHECK(cudaStreamSynchronize(s));
    BT_CUDA_CHECK(cudaStreamDestroy(s));

    const std::string t = table(rows);
    std::cout << t << std::flush;
    if (!opt.markdown.empty()) {
      std::ofstream f(opt.markdown);
      if (!f) {
        std::cerr << "bt_kernel_bench: cannot write " << opt.markdown << "\n";
        return 1;
      }
      f << head.str() << t;
    }
  } catch (const std::exception& e) {
    std::cerr << "bt_kernel_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
