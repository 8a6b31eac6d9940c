// Strict-fp32 GEMMs on the FP64 tensor cores (sm_90), Note [Strict fp32 on
// the FP64 tensor cores] in kernels/gemm.h.
//
// One kernel per operand layout (A and B each K-contiguous or not). A block
// computes a BM x BN = 64 x 64 tile of C with 4 warps (2 x 2), each a 32 x 32
// warp tile of 2 x 4 mma.sync.m16n8k16.f64 products, 32 fp64 accumulators a
// thread, three blocks an SM. The fp32 operand tiles (BK = 32 along K)
// stream into shared memory by 16-byte cp.async, kStages deep; each thread
// loads its fragments from there as fp32 and widens them (exactly) to fp64
// before the mma (3 F2F a m16n8k16 cost the DMMA pipe under 1% on an H200).
// Each thread's copies step by fixed strides from pointers set up once, and
// the next stage's copies are issued behind the first products of this one:
// recomputing each copy's 64-bit address and bounds every stage took 224 of
// the loop's 356 instructions a stage (16 of them DMMAs), and 128 x 64 tiles
// went from 52.1 to 56.4 TFLOP/s on the MLP's forward shape without it
// (bench/RESULTS.md, issue 18 step 21, with the tile shapes tried).
//
// Fragments (PTX ISA, mma.m16n8k16 .f64; g = lane / 4, t = lane % 4):
//   A (16 x 16): a[i] = A[g + 8 (i % 2)][t + 4 (i / 2)]
//   B (16 x 8):  b[i] = B[t + 4 i][g]
//   C (16 x 8):  c[i] = C[g + 8 (i / 2)][2 t + i % 2]
// When both operands are K-contiguous, mma column t + 4 j takes the tile's
// column 4 t + j of each 16 (the same relabelling of K for A and B, so the
// product sums the same 16 terms): a thread's four K values of a row are then
// one 16-byte load. Shared-memory strides keep every fragment load
// conflict-free.
//
// Few tiles over a long K (a weight gradient: C one weight matrix, K the
// tokens) would leave most SMs idle in the last wave, so such a GEMM splits K
// (Note [Split K in fp64]).
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm/gemm_internal.cuh"
#include "kernels/cuda/mma.cuh"

namespace bt::kernels::cuda {
namespace {
using namespace detail;

constexpr int BM = 64, BN = 64, BK = 32, kStages = 3, kThreads = 128, kMinBlocks = 3;
constexpr int WM = 32, WN = 32;  // warp tile; the warps are 2 x 2
constexpr int MT = WM / 16, NT = WN / 8;

// Note [Split K in fp64]
// A GEMM with few tiles of C runs as S products over consecutive ranges of K
// (whole BK steps), each writing its fp64 partial tile to scratch; a second
// kernel sums the S partials of each element in order, then applies alpha,
// beta C and the bias in fp64 and rounds once, as the unsplit kernel does.
// S is the least that fills the SMs' last wave to kSplitFill (at most
// kMaxSplit, at least kMinSplitSteps BK steps a split, the partials within
// kSplitScratchMiB); without scratch (gemm_scratch_floats) the GEMM does not
// split. Every step is in a fixed order, so a shape's bits are repeatable;
// split and unsplit sum K in different orders, so they may differ in the last
// bit of fp64, which the rounding to fp32 almost always hides.
constexpr int kMaxSplit = 8, kMinSplitSteps = 8;
constexpr double kSplitFill = 0.85;
constexpr size_t kSplitScratchMiB = 64;

/// One operand's tile in shared memory and this thread's copies into it: ROWS
/// x BK when K-contiguous (row stride LD, K along the row), else BK x ROWS (K
/// down the rows). The thread's first chunk is set up once (init); its other
/// chunks of a stage lie at fixed strides, and each stage steps K by BK.
template <int ROWS, bool KMAJOR, bool PERM>
struct Loader {
  // K-contiguous: permuted rows are read 16 bytes a lane, two rows a
  // quarter-warp, so rows sit 16 banks apart (BK + 16 floats); else BK + 4
  // (rows 4 banks apart, lanes t apart). K-strided: ROWS + 8 (the four K
  // rows of a fragment 8 banks apart).
  static constexpr int LD = KMAJOR ? (PERM ? BK + 16 : BK + 4) : ROWS + 8;
  static constexpr int kFloats = KMAJOR ? ROWS * LD : BK * LD;
  static constexpr int kPerRow = (KMAJOR ? BK : ROWS) / 4;  // 16-byte chunks along the contiguous dim
  static constexpr int kPer = kThreads / kPerRow;           // rows (K rows) a pass of the threads covers
  static constexpr int kIters = ROWS * BK / 4 / kThreads;
  static_assert(ROWS * BK / 4 % kThreads == 0 && kThreads % kPerRow == 0, "copies divide among the threads");

  const float* base;  // the operand: a valid address for zero-byte copies
  const float* src;   // this thread's first chunk at the current stage
  int64_t it_step, k_step;
  int lim;   // K-contiguous: rows left from this thread's first row; else floats left in its row
  int kpos;  // K of this thread's chunk (K-contiguous) or K row of its first chunk, at this stage
  int dst0;  // its first chunk in the tile

  __device__ __forceinline__ void init(const float* g, int64_t ld, int64_t r0, int64_t rows) {
    const int a = static_cast<int>(threadIdx.x) / kPerRow, b = (static_cast<int>(threadIdx.x) % kPerRow) * 4;
    const int64_t left = KMAJOR ? rows - r0 - a : rows - r0 - b;
    base = g;
    lim = static_cast<int>(left < INT_MAX ? left : INT_MAX);
    kpos = KMAJOR ? b : a;
    src = KMAJOR ? g + (r0 + a) * ld + b : g + a * ld + r0 + b;
    it_step = kPer * ld;
    k_step = KMAJOR ? BK : BK * ld;
    dst0 = a * LD + b;
  }
  /// Copies this stage's chunks (zeros past `rows` and K) into `s`, then steps K.
  __device__ __forceinline__ void load(float* s, int K) {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      int bytes;
      if constexpr (KMAJOR) {
        const int left = K - kpos;
        bytes = it * kPer < lim ? (left >= 4 ? 16 : left > 0 ? left * 4 : 0) : 0;
      } else {
        bytes = kpos + it * kPer < K ? (lim >= 4 ? 16 : lim > 0 ? lim * 4 : 0) : 0;
      }
      cp_async_bytes(smem_u32(s + dst0 + it * kPer * LD), bytes ? src + it * it_step : base, bytes);
    }
    src += k_step;
    kpos += BK;
  }
};

__device__ __forceinline__ void dmma16(double (&c)[4], const double (&a)[8], const double (&b)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5,%6,%7,%8,%9,%10,%11}, "
      "{%12,%13,%14,%15}, {%0,%1,%2,%3};\n"
      : "+d"(c[0]), "+d"(c[1]), "+d"(c[2]), "+d"(c[3])
      : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]), "d"(a[7]), "d"(b[0]),
        "d"(b[1]), "d"(b[2]), "d"(b[3]));
}

struct DmmaParams {
  const float* a;
  const float* b;
  float* c;
  const float* bias;  // or null
  double* partial;    // split: [batch][splits][m][n] fp64 partial products, else null
  int64_t m, n, lda, ldb, ldc, stride_a, stride_b, stride_c;
  int k, splits, k_split;  // k_split: K of a split, whole BK steps
  double alpha, beta;
};

/// KA: A is K-contiguous (!trans_a); KB: B is K-contiguous (trans_b).
/// blockIdx.z is batch item z / splits, split z % splits.
template <bool KA, bool KB>
__global__ void __launch_bounds__(kThreads, kMinBlocks) gemm_dmma_kernel(const DmmaParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kPerm = KA && KB;
  using LA = Loader<BM, KA, kPerm>;
  using LB = Loader<BN, KB, kPerm>;
  constexpr int kStage = LA::kFloats + LB::kFloats;
  extern __shared__ __align__(16) float smem_dmma[];

  const int64_t z = blockIdx.z / p.splits;
  const int split = static_cast<int>(blockIdx.z % p.splits);
  const int k0 = split * p.k_split, K = min(p.k - k0, p.k_split);
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * BM, n0 = static_cast<int64_t>(blockIdx.x) * BN;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wm = (warp >> 1) * WM, wn = (warp & 1) * WN;
  const int nk = (K + BK - 1) / BK;

  LA la;
  LB lb;
  la.init(p.a + z * p.stride_a + (KA ? k0 : k0 * p.lda), p.lda, m0, p.m);
  lb.init(p.b + z * p.stride_b + (KB ? k0 : k0 * p.ldb), p.ldb, n0, p.n);
  auto load_stage = [&](int kt) {
    float* s = smem_dmma + (kt % kStages) * kStage;
    la.load(s, K);
    lb.load(s + LA::kFloats, K);
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nk) load_stage(s);
    cp_async_commit();
  }

  double acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0;

  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt landed for all; every warp is done with stage kt - 1
    const float* sa0 = smem_dmma + (kt % kStages) * kStage;
    const float* sb0 = sa0 + LA::kFloats;
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
      const float* sa = sa0 + (KA ? 16 * ks : 16 * ks * LA::LD);
      const float* sb = sb0 + (KB ? 16 * ks : 16 * ks * LB::LD);
      double bf[NT][4];
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int n = wn + j * 8 + g;
        if constexpr (kPerm) {
          const float4 v = *reinterpret_cast<const float4*>(sb + n * LB::LD + 4 * t);
          bf[j][0] = v.x, bf[j][1] = v.y, bf[j][2] = v.z, bf[j][3] = v.w;
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i)
            bf[j][i] = KB ? sb[n * LB::LD + t + 4 * i] : sb[(t + 4 * i) * LB::LD + n];
        }
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int r = wm + mt * 16 + g;
        double af[8];
        if constexpr (kPerm) {
          const float4 lo = *reinterpret_cast<const float4*>(sa + r * LA::LD + 4 * t);
          const float4 hi = *reinterpret_cast<const float4*>(sa + (r + 8) * LA::LD + 4 * t);
          af[0] = lo.x, af[1] = hi.x, af[2] = lo.y, af[3] = hi.y;
          af[4] = lo.z, af[5] = hi.z, af[6] = lo.w, af[7] = hi.w;
        } else {
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const int row = r + 8 * (i % 2), col = t + 4 * (i / 2);
            af[i] = KA ? sa[row * LA::LD + col] : sa[col * LA::LD + row];
          }
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) dmma16(acc[mt][j], af, bf[j]);
        if (ks == 0 && mt == 0) {  // the next stage's copies, behind the first products
          if (kt + kStages - 1 < nk) load_stage(kt + kStages - 1);
          cp_async_commit();
        }
      }
    }
  }
  cp_async_wait<0>();

  if (p.partial) {  // Note [Split K in fp64]: this split's products, as they are
    double* out = p.partial + static_cast<int64_t>(blockIdx.z) * p.m * p.n;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int64_t row = m0 + wm + mt * 16 + g + 8 * (q / 2), col = n0 + wn + j * 8 + 2 * t + q % 2;
          if (row < p.m && col < p.n) out[row * p.n + col] = acc[mt][j][q];
        }
    return;
  }
  // C = alpha acc + beta C (+ bias), in fp64, rounded once.
  float* gc = p.c + z * p.stride_c;
  const bool pairs = (p.ldc % 2 == 0) && (reinterpret_cast<uintptr_t>(gc) % 8 == 0);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = m0 + wm + mt * 16 + g + 8 * h, col = n0 + wn + j * 8 + 2 * t;
        if (row >= p.m || col >= p.n) continue;
        float* out = gc + row * p.ldc + col;
        const bool two = col + 1 < p.n;
        double v0 = p.alpha * acc[mt][j][2 * h], v1 = p.alpha * acc[mt][j][2 * h + 1];
        if (p.beta != 0.0) {
          v0 += p.beta * static_cast<double>(out[0]);
          if (two) v1 += p.beta * static_cast<double>(out[1]);
        }
        if (p.bias) {
          v0 += static_cast<double>(p.bias[col]);
          if (two) v1 += static_cast<double>(p.bias[col + 1]);
        }
        if (two && pairs) {
          *reinterpret_cast<float2*>(out) = make_float2(static_cast<float>(v0), static_cast<float>(v1));
        } else {
          out[0] = static_cast<float>(v0);
          if (two) out[1] = static_cast<float>(v1);
        }
      }
#else
  __trap();  // gemm_uses_dmma keeps other architectures away
#endif
}

/// Note [Split K in fp64]: C = alpha (sum of the splits' partials, in order) +
/// beta C (+ bias), in fp64, rounded once.
__global__ void gemm_dmma_sum_splits(const DmmaParams p, int64_t batch) {
  const int64_t mn = p.m * p.n, total = batch * mn;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t z = e / mn, ij = e % mn, i = ij / p.n, j = ij % p.n;
    const double* part = p.partial + z * p.splits * mn + ij;
    double sum = 0.0;
    for (int s = 0; s < p.splits; ++s) sum += part[s * mn];
    float* out = p.c + z * p.stride_c + i * p.ldc + j;
    double v = p.alpha * sum;
    if (p.beta != 0.0) v += p.beta * static_cast<double>(*out);
    if (p.bias) v += static_cast<double>(p.bias[j]);
    *out = static_cast<float>(v);
  }
}

template <bool KA, bool KB>
constexpr int smem_bytes() {
  constexpr bool kPerm = KA && KB;
  return kStages * (Loader<BM, KA, kPerm>::kFloats + Loader<BN, KB, kPerm>::kFloats) * 4;
}

template <bool KA, bool KB>
void launch(const DmmaParams& p, int64_t batch, cudaStream_t stream) {
  constexpr int kSmem = smem_bytes<KA, KB>();
  allow_smem(gemm_dmma_kernel<KA, KB>, kSmem);  // per call: the attribute is per device
  const dim3 grid(static_cast<unsigned>((p.n + BN - 1) / BN), static_cast<unsigned>((p.m + BM - 1) / BM),
                  static_cast<unsigned>(batch * p.splits));
  gemm_dmma_kernel<KA, KB><<<grid, kThreads, kSmem, stream>>>(p);
  BT_KERNEL_CHECK();
}

// On where it runs (sm_90 built and a 9.x device); BT_GEMM_DMMA=0 at start
// turns it off, set_gemm_dmma changes it.
std::atomic<bool> g_dmma_on{[] {
  const char* v = std::getenv("BT_GEMM_DMMA");
  return v == nullptr || std::strcmp(v, "0") != 0;
}()};

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

struct DeviceInfo {
  bool available = false;
  int64_t slots = 0;  // blocks resident at once: SMs x blocks an SM
};

/// This device's: whether the kernels run here, and how many blocks fit at once.
const DeviceInfo& device_info() {
  static std::mutex mu;
  static auto* infos = new std::unordered_map<int, DeviceInfo>();
  int dev = 0;
  BT_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  auto it = infos->find(dev);
  if (it != infos->end()) return it->second;
  DeviceInfo d;
  int major = 0, sms = 0;
  BT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  BT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaFuncAttributes fa{};
  if (major == 9 && cudaFuncGetAttributes(&fa, gemm_dmma_kernel<true, true>) == cudaSuccess) {
    // Built for sm_90, not JIT-ed from an older architecture's PTX.
    d.available = fa.binaryVersion >= 90 && fa.ptxVersion >= 90;
    int per_sm = 0;
    if (d.available) {
      allow_smem(gemm_dmma_kernel<true, true>, smem_bytes<true, true>());
      BT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemm_dmma_kernel<true, true>,
                                                                  kThreads, smem_bytes<true, true>()));
    }
    d.slots = static_cast<int64_t>(sms) * (per_sm > 0 ? per_sm : 1);
  } else {
    (void)cudaGetLastError();  // no code for this device: not an error, just not here
  }
  return infos->emplace(dev, d).first->second;
}

/// Note [Split K in fp64]: how many splits `a` runs in, given the scratch it may use.
int choose_splits(const GemmArgs& a, size_t scratch_floats) {
  const int64_t tiles = ((a.m + BM - 1) / BM) * ((a.n + BN - 1) / BN) * a.batch;
  const int64_t slots = device_info().slots, steps = (a.k + BK - 1) / BK;
  const double cap = static_cast<double>(kSplitScratchMiB << 20) / 8;  // doubles
  int best = 1;
  double best_fill = 0.0;
  for (int s = 1; s <= kMaxSplit; ++s) {
    if (s > 1 && (steps / s < kMinSplitSteps ||
                  static_cast<double>(s) * a.batch * a.m * a.n > std::min(cap, scratch_floats / 2.0)))
      break;
    const int64_t blocks = tiles * s, waves = (blocks + slots - 1) / slots;
    const double fill = static_cast<double>(blocks) / static_cast<double>(waves * slots);
    if (fill > best_fill + 1e-9) best = s, best_fill = fill;
    if (fill >= kSplitFill) break;
  }
  return best;
}

}  // namespace

bool gemm_dmma_available() { return device_info().available; }
bool gemm_dmma_enabled() { return g_dmma_on.load(); }
void set_gemm_dmma(bool on) { g_dmma_on.store(on); }

bool gemm_uses_dmma(const GemmArgs& a) {
  if (!g_dmma_on.load() || a.dtype != DType::F32 || a.math != GemmMath::Strict) return false;
  if (a.c_dtype && *a.c_dtype != DType::F32) return false;
  // 16-byte copies: aligned bases, leading dimensions and batch strides in
  // whole 4-float chunks; sizes the grid and the 32-bit K indices take.
  if (!aligned16(a.a) || !aligned16(a.b) || a.lda % 4 != 0 || a.ldb % 4 != 0) return false;
  if (a.batch > 1 && (a.stride_a % 4 != 0 || a.stride_b % 4 != 0)) return false;
  if (a.k > INT_MAX / 2 || a.batch * kMaxSplit > 65535 || (a.m + BM - 1) / BM > 65535 ||
      (a.n + BN - 1) / BN > INT_MAX)
    return false;
  return device_info().available;
}

namespace gemm_detail {

size_t dmma_scratch_floats(const GemmArgs& a) {
  const int s = choose_splits(a, SIZE_MAX);
  return s > 1 ? static_cast<size_t>(s * a.batch * a.m * a.n) * 2 : 0;
}

void gemm_dmma(const GemmArgs& a, cudaStream_t stream, float* scratch, size_t scratch_floats) {
  DmmaParams p{};
  p.a = static_cast<const float*>(a.a);
  p.b = static_cast<const float*>(a.b);
  p.c = static_cast<float*>(a.c);
  p.bias = a.epilogue == Epilogue::Bias ? static_cast<const float*>(a.bias) : nullptr;
  p.m = a.m, p.n = a.n, p.k = static_cast<int>(a.k), p.lda = a.lda, p.ldb = a.ldb, p.ldc = a.ldc;
  p.stride_a = a.stride_a, p.stride_b = a.stride_b, p.stride_c = a.stride_c;
  p.alpha = a.alpha, p.beta = a.beta;
  // Scratch of unknown size (0 floats) was sized by gemm_scratch_floats: as many splits as that allows.
  const int splits = scratch ? choose_splits(a, scratch_floats ? scratch_floats : SIZE_MAX) : 1;
  p.splits = splits;
  p.k_split = static_cast<int>((a.k + splits - 1) / splits + BK - 1) / BK * BK;
  p.splits = (p.k + p.k_split - 1) / p.k_split;  // rounding up the splits' K may leave one empty
  p.partial = p.splits > 1 ? reinterpret_cast<double*>(scratch) : nullptr;
  if (p.partial == nullptr) p.splits = 1, p.k_split = p.k;
  const bool ka = !a.trans_a, kb = a.trans_b;
  if (ka && kb) {
    launch<true, true>(p, a.batch, stream);
  } else if (ka) {
    launch<true, false>(p, a.batch, stream);
  } else if (kb) {
    launch<false, true>(p, a.batch, stream);
  } else {
    launch<false, false>(p, a.batch, stream);
  }
  if (p.partial) {
    constexpr int kSumThreads = 256;
    gemm_dmma_sum_splits<<<grid_stride_blocks(a.batch * a.m * a.n, kSumThreads), kSumThreads, 0, stream>>>(
        p, a.batch);
    BT_KERNEL_CHECK();
  }
}

}  // namespace gemm_detail
}  // namespace bt::kernels::cuda
