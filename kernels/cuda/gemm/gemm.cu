// CUDA GEMM through cuBLASLt, with the bias, GELU and GELU-gradient epilogues
// fused by cuBLASLt.
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
// problem breaks an epilogue rule, e.g. aux ld % 8 != 0), the plan takes the
// next, less fused one (lt_epilogues in gemm_epilogue.cu), down to the plain
// product with the epilogue as a small kernel.
//
// GemmMath::Tf32x3 runs in gemm_x3.cu, and the epilogues cuBLASLt does not
// fuse in gemm_epilogue.cu (kernels/cuda/gemm/gemm_internal.cuh).
//
// An F32 C with BF16 A and B (GemmArgs::c_dtype) is only a C/D layout of
// CUDA_R_32F under the same CUBLAS_COMPUTE_32F: cuBLASLt supports that
// combination, and there is no epilogue (gemm_c_dtype).
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm/gemm_internal.cuh"
#include "kernels/gemm.h"

namespace bt::kernels::cuda {
namespace {
using namespace detail;
using namespace gemm_detail;

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
  int64_t epilogue;                           // Epilogue, plus 8 when pre_gelu is used, 16 with bias_grad
  int64_t bias_grad_dtype;
  int64_t m, n, k, lda, ldb, ldc, ld_aux, batch, stride_a, stride_b, stride_c;
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
  int choice = 0;                            // index into lt_epilogues(): how much cuBLASLt fuses
  uint32_t epi = CUBLASLT_EPILOGUE_DEFAULT;  // DEFAULT: plain product, then apply_epilogue

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

/// Builds the descriptors for cuBLASLt's epilogue `epi` and asks the
/// heuristic; returns false when it offers no algorithm for this epilogue.
bool build_plan(Plan& p, const PlanKey& key, const GemmArgs& a, cublasLtHandle_t lt, uint32_t epi) {
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

  p.epi = epi;
  set_lt_epilogue(p.op, epi, a, static_cast<DType>(key.c_dtype));

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
  if (st == CUBLAS_STATUS_INVALID_VALUE && epi != CUBLASLT_EPILOGUE_DEFAULT)
    return false;  // epilogue rule broken
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
               a.epilogue == Epilogue::BiasGelu || is_dgelu(a.epilogue),
           "cuda ", what, ": unknown epilogue ", static_cast<int>(a.epilogue));
  check_dgelu(a, "cuda gemm");
  BT_CHECK(a.ldc >= (a.n > 1 ? a.n : 1), "cuda ", what, ": ldc ", a.ldc, " is smaller than n = ", a.n);
  if (a.batch > 1)
    BT_CHECK(a.stride_a >= 0 && a.stride_b >= 0 && a.stride_c >= 0, "cuda ", what, ": negative batch stride");
}

thread_local uint32_t t_last_lt_epilogue = CUBLASLT_EPILOGUE_DEFAULT;

}  // namespace

namespace gemm_detail {

void* workspace(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(state_mutex());
  return workspace_for(state_for(current_device()), stream);
}

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
  key.bias_grad_dtype = a.bias_grad ? static_cast<int>(gemm_bias_grad_dtype(a, c_dtype, "cuda gemm")) : -1;
  key.m = a.m, key.n = a.n, key.k = a.k;
  key.lda = a.lda, key.ldb = a.ldb, key.ldc = a.ldc, key.ld_aux = lt_aux(a) ? lt_aux_ld(a) : 0;
  key.batch = a.batch;
  key.stride_a = a.stride_a, key.stride_b = a.stride_b, key.stride_c = a.stride_c;
  key.align_a = alignment_bytes(a.a, a.stride_a * es);
  key.align_b = alignment_bytes(a.b, a.stride_b * es);
  key.align_c = alignment_bytes(a.c, a.stride_c * es_c);
  key.align_bias = a.bias_grad ? alignment_bytes(a.bias_grad, 0) : a.bias ? alignment_bytes(a.bias, 0) : 0;
  key.align_aux = lt_aux(a) ? alignment_bytes(lt_aux(a), a.stride_c * es) : 0;

  std::lock_guard<std::mutex> lock(state_mutex());
  DeviceState& st = state_for(static_cast<int>(key.device));
  void* ws = workspace_for(st, stream);
  auto& cache = plan_cache();
  uint32_t epis[3];
  const int n_epis = lt_epilogues(a, epis);
  // The first of epis[from...] that cuBLASLt offers an algorithm for.
  auto make_plan = [&](int from) {
    for (int i = from; i < n_epis; ++i) {
      auto plan = std::make_unique<Plan>();
      if (!build_plan(*plan, key, a, st.lt, epis[i])) continue;
      plan->choice = i;
      return plan;
    }
    BT_FAIL("cuda gemm: cuBLASLt has no algorithm for ", a.dtype, " m=", a.m, " n=", a.n, " k=", a.k,
            " lda=", a.lda, " ldb=", a.ldb, " ldc=", a.ldc, " batch=", a.batch,
            " (check leading dimensions and pointer alignment)");
  };
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make_plan(0)).first;
  const float alpha = a.alpha, beta = a.beta;
  auto run = [&](Plan& p) {
    point_lt_epilogue(p.op, p.epi, a);
    return cublasLtMatmul(st.lt, p.op, &alpha, a.b, p.la, a.a, p.lb, &beta, a.c, p.lc, a.c, p.lc, &p.algo, ws,
                          kWorkspaceBytes, stream);
  };
  cublasStatus_t status = run(*it->second);
  while (status != CUBLAS_STATUS_SUCCESS && it->second->epi != CUBLASLT_EPILOGUE_DEFAULT &&
         (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE)) {
    // The fused epilogue was refused at launch: the next one, for good.
    it->second = make_plan(it->second->choice + 1);
    status = run(*it->second);
  }
  BT_CUBLAS_CHECK(status);
  const uint32_t epi = it->second->epi;
  t_last_lt_epilogue = epi;
  if (epi == CUBLASLT_EPILOGUE_DEFAULT && a.epilogue != Epilogue::None)
    apply_epilogue(a, a.dtype, false, stream);
  return a.bias_grad != nullptr && lt_writes_bias_grad(epi);
}

}  // namespace gemm_detail

void gemm(const GemmArgs& args, cudaStream_t stream, float* scratch, size_t scratch_floats) {
  validate(args, "gemm");
  const DType c_dtype = gemm_c_dtype(args, "cuda gemm");
  if (args.bias_grad) bias_grad_dims(args, "cuda gemm");
  GemmArgs a = args;
  if (a.batch <= 1) a.stride_a = a.stride_b = a.stride_c = 0;
  if (a.batch == 0) return;
  if (a.m == 0 || a.n == 0) {  // bias_grad: op(A)'s sums (n == 0) or zeros (DGeluBgrad, m == 0)
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
  if (!is_dgelu(a.epilogue)) a.gelu_in = nullptr;

  if (a.k == 0) {  // C = beta * C, then the epilogue (with an f32 C there is none)
    apply_epilogue(a, c_dtype, true, stream);
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
  if (gemm_uses_dmma(a)) {                          // Note [Strict fp32 on the FP64 tensor cores]
    gemm_dmma(a, stream, scratch, scratch_floats);  // with the Bias epilogue, the rest after it
    t_last_lt_epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    if (a.epilogue != Epilogue::None && a.epilogue != Epilogue::Bias)
      apply_epilogue(a, c_dtype, false, stream);
    if (a.bias_grad) bias_grad_sum(a, c_dtype, stream);
    return;
  }
  if (!product(a, stream) && a.bias_grad) bias_grad_sum(a, c_dtype, stream);
}

uint32_t last_lt_epilogue() { return t_last_lt_epilogue; }

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
