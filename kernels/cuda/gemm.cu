// CUDA GEMM through cuBLASLt, with bias / GELU epilogues fused by cuBLASLt.
//
// Row-major C = op(A) op(B) is computed as the column-major product
// C^T = op(B)^T op(A)^T: cuBLASLt's "A" is the caller's B and its "B" is the
// caller's A, each with the caller's leading dimension and transpose flag, and
// C^T is column-major [n, m] with ld = ldc. The bias (one value per column of
// row-major C) is then one value per row of C^T, which is what
// CUBLASLT_EPILOGUE_BIAS broadcasts.
//
// Per device: one cublasLt handle; per (device, stream): one 32 MiB workspace
// (a workspace shared by matmuls running concurrently on two streams would be a
// race). Matmul descriptors, layouts and the heuristic's algorithm are cached
// per problem key. When cuBLASLt offers no algorithm for an epilogue (or the
// problem breaks an epilogue rule, e.g. aux ld % 8 != 0), the plan runs the
// plain product and applies the epilogue with a small kernel instead.
//
// GemmMath::Tf32x3 (Note [3xTF32] in kernels/gemm.h): split_x3_kernel writes
// three copies of each operand along K into the caller's scratch, A as
// [small | big | big] and B as [big | small | big] (TF32 parts, rounded with
// cvt.rna; both K-contiguous, Note [K-contiguous copies]), and one FAST_TF32
// cuBLASLt product over 3K sums the three products with beta and the epilogue
// applied once. Note [One GEMM over 3K].
//
// An F32 C with BF16 A and B (GemmArgs::c_dtype) is only a C/D layout of
// CUDA_R_32F under the same CUBLAS_COMPUTE_32F: cuBLASLt supports that
// combination, and there is no epilogue (gemm_c_dtype).
#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "kernels/common/tf32.h"
#include "kernels/cuda/common.cuh"
#include "kernels/gemm.h"
#include "kernels/reduce.h"

namespace bt::kernels::cuda {
namespace {
using namespace detail;

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// ------------------------------------------------------------ epilogue kernel
/// For every element of C (per batch item, m x n with ldc):
///   v = scale_mode ? (beta == 0 ? 0 : beta * C) : C;  v += bias[j];
///   pre_gelu = v (if any);  C = gelu ? gelu(v) : v.
template <typename T>
__global__ void epilogue_kernel(T* c, int64_t ldc, int64_t stride_c, int64_t m, int64_t n, int64_t batch,
                                const T* __restrict__ bias, T* __restrict__ pre, bool gelu, bool scale_mode,
                                float beta) {
  const int64_t total = batch * m * n;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t j = e % n;
    const int64_t rest = e / n;
    const int64_t i = rest % m;
    const int64_t b = rest / m;
    const int64_t off = b * stride_c + i * ldc + j;
    float v;
    if (scale_mode)
      v = beta == 0.0f ? 0.0f : beta * ldf(c + off);
    else
      v = ldf(c + off);
    if (bias) v += ldf(bias + j);
    if (pre) stf(pre + off, v);
    stf(c + off, gelu ? gelu_tanh(v) : v);
  }
}

template <typename T>
void launch_epilogue(const GemmArgs& a, bool scale_mode, cudaStream_t stream) {
  const bool bias = a.epilogue == Epilogue::Bias || a.epilogue == Epilogue::BiasGelu;
  const bool gelu = a.epilogue == Epilogue::Gelu || a.epilogue == Epilogue::BiasGelu;
  T* pre = gelu ? static_cast<T*>(a.pre_gelu) : nullptr;
  const int64_t total = a.batch * a.m * a.n;
  constexpr int kThreads = 256;
  epilogue_kernel<T><<<grid_stride_blocks(total, kThreads), kThreads, 0, stream>>>(
      static_cast<T*>(a.c), a.ldc, a.stride_c, a.m, a.n, a.batch,
      bias ? static_cast<const T*>(a.bias) : nullptr, pre, gelu, scale_mode, a.beta);
  BT_KERNEL_CHECK();
}

// ------------------------------------------------------------ handles
struct DeviceState {
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t blas = nullptr;
  std::unordered_map<cudaStream_t, void*> workspaces;
};

std::mutex& state_mutex() {
  static std::mutex mu;
  return mu;
}

/// Never destroyed: handles stay valid until process exit (destroying them from
/// a static destructor can run after the CUDA runtime is gone).
std::unordered_map<int, DeviceState>& states() {
  static auto* s = new std::unordered_map<int, DeviceState>();
  return *s;
}

int current_device() {
  int dev = 0;
  BT_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

/// Caller holds state_mutex().
DeviceState& state_for(int dev) {
  DeviceState& s = states()[dev];
  if (s.lt == nullptr) BT_CUBLAS_CHECK(cublasLtCreate(&s.lt));
  return s;
}

/// Caller holds state_mutex().
void* workspace_for(DeviceState& s, cudaStream_t stream) {
  auto it = s.workspaces.find(stream);
  if (it != s.workspaces.end()) return it->second;
  void* ws = nullptr;
  BT_CUDA_CHECK(cudaMalloc(&ws, kWorkspaceBytes));
  s.workspaces.emplace(stream, ws);
  return ws;
}

// ------------------------------------------------------------ plan cache
int alignment_bytes(const void* p, int64_t batch_stride_bytes) {
  uintptr_t v = reinterpret_cast<uintptr_t>(p);
  if (batch_stride_bytes != 0) v |= static_cast<uintptr_t>(batch_stride_bytes);
  int al = 1;
  while (al < 256 && (v % (2 * static_cast<uintptr_t>(al))) == 0) al *= 2;
  return al;
}

/// All fields are int64_t, so the struct has no padding and memcmp/hash over
/// its bytes are well defined.
struct PlanKey {
  int64_t device;
  int64_t dtype, c_dtype;
  int64_t trans_a, trans_b, math, beta_zero;  // math: GemmMath of an F32 product, else 0
  int64_t epilogue;                           // Epilogue, plus 8 when pre_gelu is used
  int64_t m, n, k, lda, ldb, ldc, batch, stride_a, stride_b, stride_c;
  int64_t align_a, align_b, align_c, align_bias, align_aux;

  bool operator==(const PlanKey& o) const { return std::memcmp(this, &o, sizeof(PlanKey)) == 0; }
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    const unsigned char* p = reinterpret_cast<const unsigned char*>(&k);
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (size_t i = 0; i < sizeof(PlanKey); ++i) h = (h ^ p[i]) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool fused_epilogue = false;  // false: plain product, then epilogue_kernel
  bool has_bias_attr = false, has_aux_attr = false;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    // Destroy errors are ignored: nothing useful can be done with them here.
    if (op) cublasLtMatmulDescDestroy(op);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
  }
};

std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash>& plan_cache() {
  static auto* c = new std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash>();
  return *c;
}

cudaDataType_t cuda_type(DType dt) { return dt == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

template <typename V>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v) {
  BT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}
template <typename V>
void set_layout(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const V& v) {
  BT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, attr, &v, sizeof(v)));
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                   int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  BT_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&l, t, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  if (batch > 1) {
    set_layout(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, static_cast<int32_t>(batch));
    set_layout(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride);
  }
  return l;
}

/// Builds the descriptors and asks the heuristic; returns false when it offers
/// no algorithm for this epilogue.
bool build_plan(Plan& p, const PlanKey& key, const GemmArgs& a, cublasLtHandle_t lt, bool fused) {
  const cudaDataType_t t = cuda_type(a.dtype), tc = cuda_type(static_cast<DType>(key.c_dtype));
  const cublasComputeType_t compute =
      key.math == static_cast<int64_t>(GemmMath::Tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  BT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, compute, CUDA_R_32F));
  const int32_t op_a = a.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt A = caller's B
  const int32_t op_b = a.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt B = caller's A
  set_desc(p.op, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  set_desc(p.op, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  p.la = a.trans_b ? make_layout(t, a.k, a.n, a.ldb, a.batch, a.stride_b)
                   : make_layout(t, a.n, a.k, a.ldb, a.batch, a.stride_b);
  p.lb = a.trans_a ? make_layout(t, a.m, a.k, a.lda, a.batch, a.stride_a)
                   : make_layout(t, a.k, a.m, a.lda, a.batch, a.stride_a);
  p.lc = make_layout(tc, a.n, a.m, a.ldc, a.batch, a.stride_c);

  const bool bias = a.epilogue == Epilogue::Bias || a.epilogue == Epilogue::BiasGelu;
  const bool gelu = a.epilogue == Epilogue::Gelu || a.epilogue == Epilogue::BiasGelu;
  const bool aux = gelu && a.pre_gelu != nullptr;
  uint32_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  if (fused && a.bias_grad) {
    epi = CUBLASLT_EPILOGUE_BGRADB;  // cuBLASLt's B is our A (Note [Fused bias gradient])
  } else if (fused) {
    if (bias && gelu)
      epi = aux ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS;
    else if (gelu)
      epi = aux ? CUBLASLT_EPILOGUE_GELU_AUX : CUBLASLT_EPILOGUE_GELU;
    else if (bias)
      epi = CUBLASLT_EPILOGUE_BIAS;
  }
  set_desc(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
  p.fused_epilogue = fused && epi != CUBLASLT_EPILOGUE_DEFAULT;
  p.has_bias_attr = fused && (bias || a.bias_grad);
  p.has_aux_attr = fused && aux;
  if (p.has_bias_attr) {
    set_desc(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(a.bias_grad ? tc : t));
    set_desc(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, a.bias_grad ? a.bias_grad : a.bias);
  }
  if (p.has_aux_attr) {
    set_desc(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, a.pre_gelu);
    set_desc(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, a.ldc);
    if (a.batch > 1) set_desc(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, a.stride_c);
  }

  cublasLtMatmulPreference_t pref = nullptr;
  BT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
  } guard{pref};
  const uint64_t ws = kWorkspaceBytes;
  BT_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // Swapped operands: cuBLASLt's A is the caller's B.
  const uint32_t al_a = static_cast<uint32_t>(key.align_b), al_b = static_cast<uint32_t>(key.align_a),
                 al_c = static_cast<uint32_t>(key.align_c);
  BT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                       &al_a, sizeof(al_a)));
  BT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                       &al_b, sizeof(al_b)));
  BT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                       &al_c, sizeof(al_c)));
  BT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                       &al_c, sizeof(al_c)));

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.la, p.lb, p.lc, p.lc, pref, 1, &result, &found);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0)) return false;
  if (st == CUBLAS_STATUS_INVALID_VALUE && p.fused_epilogue) return false;  // epilogue rule broken
  BT_CUBLAS_CHECK(st);
  if (result.state != CUBLAS_STATUS_SUCCESS) return false;
  p.algo = result.algo;
  return true;
}

void validate(const GemmArgs& a, const char* what) {
  BT_CHECK(a.dtype == DType::F32 || a.dtype == DType::BF16, "cuda ", what, ": dtype ", a.dtype,
           " is not supported on CUDA (supported: f32, bf16; f64 is CPU-only)");
  BT_CHECK(a.m >= 0 && a.n >= 0 && a.k >= 0, "cuda ", what, ": negative size (m ", a.m, ", n ", a.n, ", k ",
           a.k, ")");
  BT_CHECK(a.batch >= 0 && a.batch <= INT32_MAX, "cuda ", what, ": batch ", a.batch, " out of range");
  const int64_t a_cols = a.trans_a ? a.m : a.k;
  const int64_t b_cols = a.trans_b ? a.k : a.n;
  BT_CHECK(a.lda >= (a_cols > 1 ? a_cols : 1) || a.k == 0, "cuda ", what, ": lda ", a.lda,
           " is smaller than ", a_cols, " (the columns of the row-major A", a.trans_a ? ", trans_a" : "",
           ")");
  BT_CHECK(a.ldb >= (b_cols > 1 ? b_cols : 1) || a.k == 0, "cuda ", what, ": ldb ", a.ldb,
           " is smaller than ", b_cols, " (the columns of the row-major B", a.trans_b ? ", trans_b" : "",
           ")");
  BT_CHECK(a.epilogue == Epilogue::None || a.epilogue == Epilogue::Bias || a.epilogue == Epilogue::Gelu ||
               a.epilogue == Epilogue::BiasGelu,
           "cuda ", what, ": unknown epilogue ", static_cast<int>(a.epilogue));
  BT_CHECK(a.ldc >= (a.n > 1 ? a.n : 1), "cuda ", what, ": ldc ", a.ldc, " is smaller than n = ", a.n);
  if (a.batch > 1)
    BT_CHECK(a.stride_a >= 0 && a.stride_b >= 0 && a.stride_c >= 0, "cuda ", what, ": negative batch stride");
}

/// One cuBLASLt product (Strict or Tf32 for F32), then the epilogue kernel
/// when cuBLASLt could not fuse the epilogue. The caller checked the arguments
/// (gemm) or built them (gemm_x3); k > 0. Returns whether cuBLASLt also wrote
/// a.bias_grad (else the caller sums it: Note [Fused bias gradient]).
bool product(const GemmArgs& a, cudaStream_t stream) {
  const DType c_dtype = gemm_c_dtype(a, "cuda gemm");
  const int64_t es = static_cast<int64_t>(dtype_size(a.dtype)),
                es_c = static_cast<int64_t>(dtype_size(c_dtype));
  PlanKey key{};
  key.device = current_device();
  key.dtype = static_cast<int>(a.dtype);
  key.c_dtype = static_cast<int>(c_dtype);
  key.trans_a = a.trans_a;
  key.trans_b = a.trans_b;
  key.math = a.dtype == DType::F32 ? static_cast<int64_t>(a.math) : 0;
  key.beta_zero = a.beta == 0.0f;
  key.epilogue = static_cast<int>(a.epilogue) + (a.pre_gelu ? 8 : 0) + (a.bias_grad ? 16 : 0);
  key.m = a.m, key.n = a.n, key.k = a.k;
  key.lda = a.lda, key.ldb = a.ldb, key.ldc = a.ldc;
  key.batch = a.batch;
  key.stride_a = a.stride_a, key.stride_b = a.stride_b, key.stride_c = a.stride_c;
  key.align_a = alignment_bytes(a.a, a.stride_a * es);
  key.align_b = alignment_bytes(a.b, a.stride_b * es);
  key.align_c = alignment_bytes(a.c, a.stride_c * es_c);
  key.align_bias = a.bias_grad ? alignment_bytes(a.bias_grad, 0) : a.bias ? alignment_bytes(a.bias, 0) : 0;
  key.align_aux = a.pre_gelu ? alignment_bytes(a.pre_gelu, a.stride_c * es) : 0;

  std::lock_guard<std::mutex> lock(state_mutex());
  DeviceState& st = state_for(static_cast<int>(key.device));
  void* ws = workspace_for(st, stream);
  auto& cache = plan_cache();
  // cuBLASLt's aux matrix needs ld and batch stride divisible by 8.
  const bool aux_ok = a.pre_gelu == nullptr ||
                      (a.ldc % 8 == 0 && (a.batch <= 1 || a.stride_c % 8 == 0) && key.align_aux >= 16);
  auto make_plan = [&](bool try_fused) {
    auto plan = std::make_unique<Plan>();
    bool ok = false;
    if (try_fused && (a.epilogue != Epilogue::None || a.bias_grad) && aux_ok)
      ok = build_plan(*plan, key, a, st.lt, true);
    if (!ok) {
      plan = std::make_unique<Plan>();
      ok = build_plan(*plan, key, a, st.lt, false);
    }
    BT_CHECK(ok, "cuda gemm: cuBLASLt has no algorithm for ", a.dtype, " m=", a.m, " n=", a.n, " k=", a.k,
             " lda=", a.lda, " ldb=", a.ldb, " ldc=", a.ldc, " batch=", a.batch,
             " (check leading dimensions and pointer alignment)");
    return plan;
  };
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make_plan(true)).first;
  const float alpha = a.alpha, beta = a.beta;
  auto run = [&](Plan& p) {
    if (p.has_bias_attr)
      set_desc(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, a.bias_grad ? a.bias_grad : a.bias);
    if (p.has_aux_attr) set_desc(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, a.pre_gelu);
    return cublasLtMatmul(st.lt, p.op, &alpha, a.b, p.la, a.a, p.lb, &beta, a.c, p.lc, a.c, p.lc, &p.algo, ws,
                          kWorkspaceBytes, stream);
  };
  cublasStatus_t status = run(*it->second);
  if (status != CUBLAS_STATUS_SUCCESS && it->second->fused_epilogue &&
      (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE)) {
    // The fused epilogue was refused at launch: fall back to product + kernel for good.
    it->second = make_plan(false);
    status = run(*it->second);
  }
  BT_CUBLAS_CHECK(status);
  if (!it->second->fused_epilogue && a.epilogue != Epilogue::None)
    dispatch_float(a.dtype, "gemm",
                   [&](auto tag) { launch_epilogue<typename decltype(tag)::type>(a, false, stream); });
  return a.bias_grad != nullptr && it->second->fused_epilogue;
}

/// Note [Fused bias gradient] without cuBLASLt: op(A) summed over k by the
/// reduction kernel sum() uses, its scratch in this stream's cuBLASLt
/// workspace (stream order keeps the two apart).
void bias_grad_sum(const GemmArgs& a, DType c_dtype, cudaStream_t stream) {
  if (a.k == 0) {
    BT_CUDA_CHECK(cudaMemsetAsync(a.bias_grad, 0, static_cast<size_t>(a.m) * dtype_size(c_dtype), stream));
    return;
  }
  const BiasGradDims d = bias_grad_dims(a, "cuda gemm");
  const size_t floats = reduce_dim_scratch_floats(ReduceOp::Sum, d.outer, d.dim, d.inner);
  BT_CHECK(floats * sizeof(float) <= kWorkspaceBytes, "cuda gemm: the bias gradient's ", floats,
           " floats of scratch exceed the workspace");
  float* scratch = nullptr;
  if (floats) {
    std::lock_guard<std::mutex> lock(state_mutex());
    scratch = static_cast<float*>(workspace_for(state_for(current_device()), stream));
  }
  reduce_dim(ReduceOp::Sum, a.dtype, c_dtype, a.a, a.bias_grad, d.outer, d.dim, d.inner, scratch, stream);
}

// ------------------------------------------------------------ 3xTF32
// Note [One GEMM over 3K]
// The three products could be three FAST_TF32 GEMMs on two copies of each
// operand (big, small), accumulating into C with beta = 1 after the first.
// One GEMM over [A_small A_big A_big] x [B_big; B_small; B_big] does the same
// tensor-core work in one launch, on three copies: its split writes |A| + |B|
// more floats, and it reads and writes C once instead of three times (two
// reads and two writes fewer). So it moves less when |A| + |B| < 4 |C|.
// Over one step of GPT-2 124M at 16384 tokens (12 layers, 4 linears each, and
// the LM head), counted from the sizes (not measured), it moves about 41 GB
// less -- the LM head's forward 13 GB (3.3G floats of logits against 51M of
// operands), the QKV and MLP-up projections' forward and the MLP-down
// projection's input gradient 7-9 GB each -- and about 15 GB more: the
// weight gradients (K = the tokens, C one weight matrix) 8 GB, the LM head's
// backward 6 GB (which runs in pieces either way). One path, not two.
//
// Scratch. Three copies of both operands of the LM head's backward would take
// ~10 GB; the split operands of one piece of the GEMM never take more than
// kX3ScratchFloats (512 MiB). A GEMM that needs more runs in pieces, cut along
// the one dimension that moves the fewest extra floats: batch items (free),
// rows of C (each extra piece reads B's copies again: 3 k n), columns (3 k m),
// or K (each piece after the first reads and writes C again, beta = 1: 2 m n;
// the epilogue runs on the last). Each operand is split once per piece of its
// own (a cut along rows splits B once).

constexpr size_t kX3ScratchFloats = (size_t{512} << 20) / sizeof(float);
constexpr int64_t kX3Align = 64;  // floats: B's copies start 256 bytes aligned

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

/// x rounded to TF32, to nearest with ties away from zero: cvt.rna, the
/// rounding of round_to_tf32 (kernels/common/tf32.h) on the host.
__device__ __forceinline__ float tf32_rna(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return __uint_as_float(r);
}

/// For each of `items` matrices of rows x cols (K along the columns) at src +
/// b * src_stride (ld), three copies along K at dst + b * dst_stride: each row
/// becomes [seg 0 | seg 1 | seg 2], segment s holding the small TF32 parts
/// when bit s of small_mask is set, else the big ones (Note [K-contiguous
/// copies]). The y blocks walk the rows, the x threads a row's columns:
/// coalesced on both sides, one division per row.
__global__ void split_x3_kernel(const float* __restrict__ src, int64_t ld, int64_t src_stride,
                                float* __restrict__ dst, int64_t dst_stride, int64_t rows, int64_t cols,
                                int64_t items, unsigned small_mask) {
  for (int64_t row = blockIdx.y; row < items * rows; row += gridDim.y) {
    const int64_t b = row / rows, r = row % rows;
    const float* s = src + b * src_stride + r * ld;
    float* d = dst + b * dst_stride + r * 3 * cols;
    for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < cols;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const float x = s[j];
      const float big = tf32_rna(x);
      const float small = isfinite(big) ? tf32_rna(x - big) : 0.0f;
      for (int seg = 0; seg < 3; ++seg) d[seg * cols + j] = (small_mask >> seg) & 1u ? small : big;
    }
  }
}

/// The transposing variant, for an operand stored with K along its rows (an A
/// read transposed, a B read as it is): src is rows (K) x cols, and dst gets
/// cols rows of [seg 0 | seg 1 | seg 2] with K contiguous, the layout
/// split_x3_kernel gives a K-along-columns operand. 32 x 32 tiles go through
/// shared memory so that both the reads and the writes are coalesced; item b
/// is blockIdx.z. Note [K-contiguous copies].
__global__ void split_x3_t_kernel(const float* __restrict__ src, int64_t ld, int64_t src_stride,
                                  float* __restrict__ dst, int64_t dst_stride, int64_t rows, int64_t cols,
                                  unsigned small_mask) {
  __shared__ float big_t[32][33], small_t[32][33];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * 32, c0 = static_cast<int64_t>(blockIdx.x) * 32;
  const float* s = src + static_cast<int64_t>(blockIdx.z) * src_stride;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    const float x = r < rows && c < cols ? s[r * ld + c] : 0.0f;
    const float big = tf32_rna(x);
    big_t[i][threadIdx.x] = big;
    small_t[i][threadIdx.x] = isfinite(big) ? tf32_rna(x - big) : 0.0f;
  }
  __syncthreads();
  float* d = dst + static_cast<int64_t>(blockIdx.z) * dst_stride;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (c >= cols || r >= rows) continue;
    const float big = big_t[threadIdx.x][i], small = small_t[threadIdx.x][i];
    for (int seg = 0; seg < 3; ++seg)
      d[c * 3 * rows + seg * rows + r] = (small_mask >> seg) & 1u ? small : big;
  }
}

unsigned mask_of(const bool small[3]) {
  return (small[0] ? 1u : 0u) | (small[1] ? 2u : 0u) | (small[2] ? 4u : 0u);
}

/// Floats of scratch for one piece: A's three copies (padded for alignment), then B's.
int64_t x3_floats(const GemmArgs& a, const GemmPieces& p) {
  const int64_t items_a = a.stride_a == 0 ? 1 : p.batch, items_b = a.stride_b == 0 ? 1 : p.batch;
  return round_up(3 * p.k * p.m * items_a, kX3Align) + 3 * p.k * p.n * items_b;
}

/// The pieces that fit `floats` of scratch (Note [One GEMM over 3K]).
GemmPieces x3_pieces(const GemmArgs& a, int64_t floats) {
  const GemmPieces whole{a.batch, a.m, a.n, a.k};
  if (x3_floats(a, whole) <= floats) return whole;
  // Batch items: the most that fit (the pad is at most kX3Align - 1).
  const int64_t fixed = (a.stride_a == 0 ? 3 * a.k * a.m : 0) + (a.stride_b == 0 ? 3 * a.k * a.n : 0);
  const int64_t per_item = (a.stride_a == 0 ? 0 : 3 * a.k * a.m) + (a.stride_b == 0 ? 0 : 3 * a.k * a.n);
  if (per_item > 0 && fixed + per_item + kX3Align <= floats)
    return {std::min(a.batch, (floats - kX3Align - fixed) / per_item), a.m, a.n, a.k};
  // One item at a time, cut along m, n or k: the fewest extra floats moved.
  const int64_t room = floats - kX3Align;
  GemmPieces best{0, 0, 0, 0};
  double best_cost = 0;
  auto consider = [&](GemmPieces p, int64_t pieces, double extra) {
    if (p.m < 1 || p.n < 1 || p.k < 1 || x3_floats(a, p) > floats) return;
    const double cost = static_cast<double>(pieces - 1) * extra;
    if (best.batch == 0 || cost < best_cost) best = p, best_cost = cost;
  };
  const auto piece = [](int64_t dim, int64_t most) {  // equal pieces of at most `most`
    const int64_t n = ceil_div(dim, std::max<int64_t>(most, 1));
    return std::pair<int64_t, int64_t>{ceil_div(dim, n), n};
  };
  if (const int64_t most = room / (3 * a.k) - a.n; most >= 1) {
    const auto [mc, n] = piece(a.m, most);
    consider({1, mc, a.n, a.k}, n, 3.0 * a.k * a.n);
  }
  if (const int64_t most = room / (3 * a.k) - a.m; most >= 1) {
    const auto [nc, n] = piece(a.n, most);
    consider({1, a.m, nc, a.k}, n, 3.0 * a.k * a.m);
  }
  if (const int64_t most = room / (3 * (a.m + a.n)); most >= 1) {
    const auto [kc, n] = piece(a.k, most);
    consider({1, a.m, a.n, kc}, n, 2.0 * a.m * a.n);
  }
  BT_CHECK(best.batch > 0, "cuda gemm: fp32x3 needs at least ", 3 * (a.m + a.n) + kX3Align,
           " floats of scratch for m=", a.m, " n=", a.n, "; got ", floats);
  return best;
}

// Note [K-contiguous copies]
// The split copies of both operands are written with K contiguous -- A as
// m rows of 3K, B as n rows of 3K (the product reads it transposed) --
// whatever layout the caller's operands have: the TF32 tensor-core GEMM runs
// fastest on that layout. Copying each operand as it lay made GPT-2's weight
// gradient (A = dY^T, B = X, K = 16384) run at 1.03x strict SGEMM on an H100
// against 2.34x for the forward's K-contiguous operands (bt_kernel_bench's
// GPT-2 MLP rows); the split pass moves the same bytes either way, the
// transposing one through shared-memory tiles.

/// The 3xTF32 GEMM, piece by piece: split the operands' pieces into scratch
/// (each only when it changes), then one FAST_TF32 product over 3K.
void gemm_x3(const GemmArgs& a, const GemmPieces& p, float* scratch, cudaStream_t stream) {
  float* a3 = scratch;
  float* b3 = scratch + round_up(3 * p.k * p.m * (a.stride_a == 0 ? 1 : p.batch), kX3Align);
  const float* A = static_cast<const float*>(a.a);
  const float* B = static_cast<const float*>(a.b);
  constexpr int kThreads = 256;
  // An operand with K along its columns.
  auto split = [&](const float* src, int64_t ld, int64_t src_stride, float* dst, int64_t rows, int64_t cols,
                   int64_t items, const bool small[3]) {
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(ceil_div(cols, kThreads), 65535)),
                    static_cast<unsigned>(std::min<int64_t>(items * rows, 65535)));
    split_x3_kernel<<<grid, kThreads, 0, stream>>>(src, ld, src_stride, dst, 3 * rows * cols, rows, cols,
                                                   items, mask_of(small));
    BT_KERNEL_CHECK();
  };
  // An operand with K along its rows (rows = K): transposed into K-contiguous copies.
  auto split_t = [&](const float* src, int64_t ld, int64_t src_stride, float* dst, int64_t rows, int64_t cols,
                     int64_t items, const bool small[3]) {
    const dim3 grid(static_cast<unsigned>(ceil_div(cols, 32)), static_cast<unsigned>(ceil_div(rows, 32)),
                    static_cast<unsigned>(items));
    BT_CHECK(grid.y <= 65535 && grid.z <= 65535, "cuda gemm: fp32x3 piece too large to split (", rows, " x ",
             cols, " x ", items, ")");
    split_x3_t_kernel<<<grid, dim3(32, 8), 0, stream>>>(src, ld, src_stride, dst, 3 * rows * cols, rows, cols,
                                                        mask_of(small));
    BT_KERNEL_CHECK();
  };
  // Which piece of each operand scratch holds now: (batch item, row or column, k).
  std::array<int64_t, 3> split_a{-1, -1, -1}, split_b{-1, -1, -1};
  for (int64_t b0 = 0; b0 < a.batch; b0 += p.batch) {
    const int64_t bc = std::min(p.batch, a.batch - b0);
    const int64_t items_a = a.stride_a == 0 ? 1 : bc, items_b = a.stride_b == 0 ? 1 : bc;
    for (int64_t i0 = 0; i0 < a.m; i0 += p.m) {
      const int64_t mc = std::min(p.m, a.m - i0);
      for (int64_t j0 = 0; j0 < a.n; j0 += p.n) {
        const int64_t nc = std::min(p.n, a.n - j0);
        for (int64_t k0 = 0; k0 < a.k; k0 += p.k) {
          const int64_t kc = std::min(p.k, a.k - k0);
          if (const std::array<int64_t, 3> at{a.stride_a == 0 ? 0 : b0, i0, k0}; at != split_a) {
            const float* src = A + b0 * a.stride_a + (a.trans_a ? k0 * a.lda + i0 : i0 * a.lda + k0);
            if (a.trans_a)
              split_t(src, a.lda, a.stride_a, a3, kc, mc, items_a, kX3SmallA);
            else
              split(src, a.lda, a.stride_a, a3, mc, kc, items_a, kX3SmallA);
            split_a = at;
          }
          if (const std::array<int64_t, 3> at{a.stride_b == 0 ? 0 : b0, j0, k0}; at != split_b) {
            const float* src = B + b0 * a.stride_b + (a.trans_b ? j0 * a.ldb + k0 : k0 * a.ldb + j0);
            if (a.trans_b)
              split(src, a.ldb, a.stride_b, b3, nc, kc, items_b, kX3SmallB);
            else
              split_t(src, a.ldb, a.stride_b, b3, kc, nc, items_b, kX3SmallB);
            split_b = at;
          }
          GemmArgs s = a;
          s.math = GemmMath::Tf32;
          s.bias_grad = nullptr;  // summed from the caller's A by gemm()
          s.m = mc, s.n = nc, s.k = 3 * kc;
          s.batch = bc;
          // Note [K-contiguous copies]: A' is [m, 3K], B' is [n, 3K] read transposed.
          s.trans_a = false, s.trans_b = true;
          s.a = a3, s.lda = 3 * kc, s.stride_a = a.stride_a == 0 ? 0 : 3 * kc * mc;
          s.b = b3, s.ldb = 3 * kc, s.stride_b = a.stride_b == 0 ? 0 : 3 * kc * nc;
          const int64_t c_off = b0 * a.stride_c + i0 * a.ldc + j0;
          s.c = static_cast<float*>(a.c) + c_off;
          if (k0 > 0) s.beta = 1.0f;  // C holds the earlier pieces of K
          if (k0 + kc < a.k) {
            s.epilogue = Epilogue::None;  // the epilogue applies to the whole sum
            s.bias = nullptr, s.pre_gelu = nullptr;
          } else {
            if (s.bias) s.bias = static_cast<const float*>(a.bias) + j0;
            if (s.pre_gelu) s.pre_gelu = static_cast<float*>(a.pre_gelu) + c_off;
          }
          if (bc <= 1) s.stride_a = s.stride_b = s.stride_c = 0;
          product(s, stream);
        }
      }
    }
  }
}

}  // namespace

size_t gemm_scratch_floats(const GemmArgs& a) {
  if (a.dtype != DType::F32 || a.math != GemmMath::Tf32x3 || a.batch <= 0 || a.m <= 0 || a.n <= 0 || a.k <= 0)
    return 0;
  GemmArgs g = a;
  if (g.batch <= 1) g.stride_a = g.stride_b = g.stride_c = 0;
  return static_cast<size_t>(x3_floats(g, x3_pieces(g, static_cast<int64_t>(kX3ScratchFloats))));
}

GemmPieces gemm_x3_pieces(const GemmArgs& a, size_t scratch_floats) {
  GemmArgs g = a;
  if (g.batch <= 1) g.stride_a = g.stride_b = g.stride_c = 0;
  BT_CHECK(g.batch > 0 && g.m > 0 && g.n > 0 && g.k > 0, "cuda gemm_x3_pieces: an empty GEMM has no pieces");
  // At least what the GEMM asks for: its own pieces, not a cut to fit exactly that.
  const bool enough = scratch_floats == 0 || scratch_floats >= gemm_scratch_floats(g);
  return x3_pieces(g, static_cast<int64_t>(enough ? kX3ScratchFloats : scratch_floats));
}

void gemm(const GemmArgs& args, cudaStream_t stream, float* scratch, size_t scratch_floats) {
  validate(args, "gemm");
  const DType c_dtype = gemm_c_dtype(args, "cuda gemm");
  if (args.bias_grad) bias_grad_dims(args, "cuda gemm");
  GemmArgs a = args;
  if (a.batch <= 1) a.stride_a = a.stride_b = a.stride_c = 0;
  if (a.batch == 0 || a.m == 0) return;
  if (a.n == 0) {
    if (a.bias_grad) bias_grad_sum(a, c_dtype, stream);
    return;
  }
  BT_CHECK(a.c != nullptr, "cuda gemm: null C");
  const bool bias = a.epilogue == Epilogue::Bias || a.epilogue == Epilogue::BiasGelu;
  const bool gelu = a.epilogue == Epilogue::Gelu || a.epilogue == Epilogue::BiasGelu;
  BT_CHECK(!bias || a.bias != nullptr, "cuda gemm: the bias epilogue needs a bias pointer");
  BT_CHECK(a.epilogue != Epilogue::Bias || a.beta == 0.0f,
           "cuda gemm: the Bias epilogue requires beta == 0 (got beta ", a.beta,
           "); add the bias separately when accumulating into C");
  if (!gelu) a.pre_gelu = nullptr;
  if (!bias) a.bias = nullptr;

  if (a.k == 0) {  // C = beta * C, then the epilogue (with an f32 C there is none)
    dispatch_float(c_dtype, "gemm",
                   [&](auto tag) { launch_epilogue<typename decltype(tag)::type>(a, true, stream); });
    if (a.bias_grad) bias_grad_sum(a, c_dtype, stream);
    return;
  }
  BT_CHECK(a.a != nullptr && a.b != nullptr, "cuda gemm: null A or B");
  if (a.dtype != DType::F32) a.math = GemmMath::Strict;
  if (a.math == GemmMath::Tf32x3) {
    BT_CHECK(scratch != nullptr, "cuda gemm: fp32x3 (GemmMath::Tf32x3) needs gemm_scratch_floats(args) = ",
             gemm_scratch_floats(a), " floats of scratch; none was given");
    gemm_x3(a, gemm_x3_pieces(a, scratch_floats), scratch, stream);
    if (a.bias_grad) bias_grad_sum(a, c_dtype, stream);
    return;
  }
  if (!product(a, stream) && a.bias_grad) bias_grad_sum(a, c_dtype, stream);
}

void cublas_reference_gemm(const GemmArgs& args, cudaStream_t stream) {
  validate(args, "cublas_reference_gemm");
  BT_CHECK(gemm_c_dtype(args, "cuda cublas_reference_gemm") == args.dtype,
           "cuda cublas_reference_gemm: a C of another dtype than A and B (c_dtype) is not supported");
  BT_CHECK(args.epilogue == Epilogue::None && !args.bias_grad,
           "cuda cublas_reference_gemm: epilogues and bias_grad are not supported");
  const GemmArgs& a = args;
  if (a.batch == 0 || a.m == 0 || a.n == 0) return;
  BT_CHECK(a.k > 0, "cuda cublas_reference_gemm: k must be positive");
  BT_CHECK(a.a != nullptr && a.b != nullptr && a.c != nullptr, "cuda cublas_reference_gemm: null matrix");
  std::lock_guard<std::mutex> lock(state_mutex());
  DeviceState& st = state_for(current_device());
  if (st.blas == nullptr) BT_CUBLAS_CHECK(cublasCreate(&st.blas));
  BT_CUBLAS_CHECK(cublasSetStream(st.blas, stream));
  const cublasOperation_t op_a = a.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // swapped, as in gemm()
  const cublasOperation_t op_b = a.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int m = static_cast<int>(a.n), n = static_cast<int>(a.m), k = static_cast<int>(a.k);
  const int lda = static_cast<int>(a.ldb), ldb = static_cast<int>(a.lda), ldc = static_cast<int>(a.ldc);
  const float alpha = a.alpha, beta = a.beta;
  const int batch = static_cast<int>(a.batch);
  BT_CHECK(a.math != GemmMath::Tf32x3 || a.dtype != DType::F32,
           "cuda cublas_reference_gemm: no 3xTF32 in plain cuBLAS (use GemmMath::Strict or Tf32)");
  if (a.dtype == DType::F32 && a.math == GemmMath::Strict) {
    BT_CUBLAS_CHECK(cublasSetMathMode(st.blas, CUBLAS_DEFAULT_MATH));
    if (batch == 1)
      BT_CUBLAS_CHECK(cublasSgemm(st.blas, op_a, op_b, m, n, k, &alpha, static_cast<const float*>(a.b), lda,
                                  static_cast<const float*>(a.a), ldb, &beta, static_cast<float*>(a.c), ldc));
    else
      BT_CUBLAS_CHECK(cublasSgemmStridedBatched(st.blas, op_a, op_b, m, n, k, &alpha,
                                                static_cast<const float*>(a.b), lda, a.stride_b,
                                                static_cast<const float*>(a.a), ldb, a.stride_a, &beta,
                                                static_cast<float*>(a.c), ldc, a.stride_c, batch));
    return;
  }
  const cudaDataType_t t = cuda_type(a.dtype);
  const cublasComputeType_t compute =
      a.dtype == DType::F32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  if (batch == 1)
    BT_CUBLAS_CHECK(cublasGemmEx(st.blas, op_a, op_b, m, n, k, &alpha, a.b, t, lda, a.a, t, ldb, &beta, a.c,
                                 t, ldc, compute, CUBLAS_GEMM_DEFAULT));
  else
    BT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(st.blas, op_a, op_b, m, n, k, &alpha, a.b, t, lda, a.stride_b,
                                               a.a, t, ldb, a.stride_a, &beta, a.c, t, ldc, a.stride_c, batch,
                                               compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace bt::kernels::cuda
