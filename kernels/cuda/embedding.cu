// CUDA embedding lookup and its deterministic backward.
//
// Note [The embedding backward by sorted runs]
// The backward adds each gradient row d[i] into table row idx[i]. Summing in
// index order, one thread per output element, makes it reproducible with no
// atomics. The indices are sorted with their positions (CUB's radix sort,
// stable, so each row's positions stay in index order); each run of equal
// keys is one table row, and 16-byte packs of that row are summed by one
// thread each, from zero, in position order, several rows' loads in flight,
// then stored once -- or, with accumulate, added onto the row's value, as
// the engine would add a zeroed table holding these sums. A run of many
// terms (a frequent token) is the longest chain; rows outside every run are
// never read or written, so adding into an existing gradient (GPT's tied
// wte: its head's gradient, Note [Adding into the gradient so far] in
// runtime/autograd/engine.cpp) costs the touched rows alone and gives the
// bits of the sum it replaces. An index outside [0, num) sorts last (key
// num) and adds nothing. Sums are in float; a bf16 table is rounded as a
// zeroed one would hold the sum.
#include <algorithm>
#include <bit>
#include <climits>
#include <type_traits>

#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/embedding.h"

namespace bt::kernels::cuda {
namespace {
using namespace detail;

/// out[i, c] = table[idx[i], c] for chunks of type U (raw bits); NaN bits
/// (all ones) for an index outside [0, num).
template <typename U>
__global__ void embed_fwd_kernel(const U* __restrict__ table, int64_t num, int64_t chunks,
                                 const int32_t* __restrict__ idx, int64_t n, U* __restrict__ out,
                                 U nan_bits) {
  const int64_t total = n * chunks;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t i = e / chunks, c = e - i * chunks;
    const int64_t r = idx[i];
    out[e] = (r >= 0 && r < num) ? table[r * chunks + c] : nan_bits;
  }
}

__global__ void count_bad_kernel(const int32_t* __restrict__ idx, int64_t n, int64_t num, int* bad) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // Every lane of a warp runs the same number of iterations (n is rounded up).
  const int64_t n_round = (n + 31) / 32 * 32;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_round; i += stride) {
    bool is_bad = false;
    if (i < n) {
      const int64_t r = idx[i];
      is_bad = r < 0 || r >= num;
    }
    const unsigned mask = __ballot_sync(0xffffffffu, is_bad);
    if ((threadIdx.x & 31) == 0 && mask != 0) atomicAdd(bad, __popc(mask));
  }
}

/// keys[i] = idx[i], or num for an index outside [0, num); pos[i] = i.
__global__ void embed_sort_keys_kernel(const int32_t* __restrict__ idx, int64_t n, int64_t num,
                                       uint32_t* __restrict__ keys, int32_t* __restrict__ pos) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t r = idx[i];
  keys[i] = static_cast<uint32_t>(r >= 0 && r < num ? r : num);
  pos[i] = static_cast<int32_t>(i);
}

/// Note [The embedding backward by sorted runs]: thread (entry i, pack q) with
/// i the start of a run of key k sums packs q of rows d[pos[j]] for the run's
/// j into out row k (V elements a pack; P packs a row).
template <typename T, typename O, int V>
__global__ void __launch_bounds__(256)
    embed_bwd_runs_kernel(const T* __restrict__ d, const uint32_t* __restrict__ keys,
                          const int32_t* __restrict__ pos, int64_t n, int64_t num, int64_t dim, int64_t P,
                          O* out, bool accumulate) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n * P) return;
  const int64_t i = t / P, col = (t - i * P) * V;
  const uint32_t k = keys[i];
  if (k >= num || (i > 0 && keys[i - 1] == k)) return;
  using In = Pack<T, V>;
  float s[V];
  O* dst = out + static_cast<int64_t>(k) * dim + col;
#pragma unroll
  for (int v = 0; v < V; ++v) s[v] = 0.0f;
  auto add = [&](const In& x) {
#pragma unroll
    for (int v = 0; v < V; ++v) s[v] += to_float(x.v[v]);
  };
  auto row = [&](int64_t j) {
    return *reinterpret_cast<const In*>(d + static_cast<int64_t>(pos[j]) * dim + col);
  };
  int64_t j = i;
  for (; j + 3 < n && keys[j + 3] == k; j += 4) {  // keys are sorted: j .. j + 3 are all k
    const In a = row(j), b = row(j + 1), c = row(j + 2), e = row(j + 3);
    add(a), add(b), add(c), add(e);
  }
  for (; j < n && keys[j] == k; ++j) add(row(j));
#pragma unroll
  // With accumulate the row's sum, rounded to O, is added onto the row: the
  // bits of the engine adding a zeroed table's gradient to the one so far.
  for (int v = 0; v < V; ++v)
    dst[v] =
        accumulate ? from_float<O>(to_float(dst[v]) + to_float(from_float<O>(s[v]))) : from_float<O>(s[v]);
}

/// The workspace's layout: keys and positions, in and sorted, then CUB's.
struct SortSpace {
  uint32_t *keys_in, *keys_out;
  int32_t *pos_in, *pos_out;
  void* cub;
  size_t cub_bytes;
};

int key_bits(int64_t num) {
  return std::max(1, static_cast<int>(std::bit_width(static_cast<uint64_t>(num))));
}

size_t cub_sort_bytes(int64_t n, int64_t num) {
  size_t bytes = 0;
  BT_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                      static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                      static_cast<int32_t*>(nullptr), static_cast<int>(n), 0, key_bits(num)));
  return bytes;
}

constexpr size_t align256(size_t b) { return (b + 255) / 256 * 256; }

SortSpace sort_space(void* base, int64_t n, int64_t num) {
  char* p = static_cast<char*>(base);
  const size_t arr = align256(static_cast<size_t>(n) * 4);
  SortSpace s;
  s.keys_in = reinterpret_cast<uint32_t*>(p);
  s.keys_out = reinterpret_cast<uint32_t*>(p + arr);
  s.pos_in = reinterpret_cast<int32_t*>(p + 2 * arr);
  s.pos_out = reinterpret_cast<int32_t*>(p + 3 * arr);
  s.cub = p + 4 * arr;
  s.cub_bytes = cub_sort_bytes(n, num);
  return s;
}

template <typename T, typename O, int V>
void launch_runs(const T* d, const SortSpace& s, int64_t n, int64_t num, int64_t dim, O* out, bool accumulate,
                 cudaStream_t stream) {
  const int64_t P = dim / V, threads = n * P;
  BT_CHECK(ceil_div(threads, 256) < INT_MAX, "cuda embedding_backward: ", n, " indices of dim ", dim,
           " are too many");
  embed_bwd_runs_kernel<T, O, V><<<static_cast<unsigned>(ceil_div(threads, 256)), 256, 0, stream>>>(
      d, s.keys_out, s.pos_out, n, num, dim, P, out, accumulate);
  BT_KERNEL_CHECK();
}

void check_sizes(const char* what, int64_t num, int64_t dim, int64_t n) {
  BT_CHECK(num >= 0 && dim >= 0 && n >= 0, "cuda ", what, ": negative size (num ", num, ", dim ", dim, ", n ",
           n, ")");
}

}  // namespace

void count_out_of_range(const int32_t* idx, int64_t n, int64_t num, int* bad_count, cudaStream_t stream) {
  BT_CHECK(n >= 0, "cuda count_out_of_range: negative count ", n);
  BT_CHECK(bad_count != nullptr, "cuda count_out_of_range: null bad_count");
  BT_CUDA_CHECK(cudaMemsetAsync(bad_count, 0, sizeof(int), stream));
  if (n == 0) return;
  BT_CHECK(idx != nullptr, "cuda count_out_of_range: null indices");
  constexpr int kThreads = 256;
  count_bad_kernel<<<grid_stride_blocks(n, kThreads), kThreads, 0, stream>>>(idx, n, num, bad_count);
  BT_KERNEL_CHECK();
}

void embedding_forward(DType dt, const void* table, int64_t num, int64_t dim, const int32_t* idx, int64_t n,
                       void* out, cudaStream_t stream) {
  check_sizes("embedding_forward", num, dim, n);
  dispatch_float(dt, "embedding_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (n == 0 || dim == 0) return;
    BT_CHECK(table != nullptr && idx != nullptr && out != nullptr, "cuda embedding_forward: null buffer");
    constexpr int kThreads = 256;
    const int64_t row_bytes = dim * static_cast<int64_t>(sizeof(T));
    if (row_bytes % 16 == 0 && aligned_to(table, 16) && aligned_to(out, 16)) {
      const int64_t chunks = row_bytes / 16;
      const uint4 nan_bits = make_uint4(~0u, ~0u, ~0u, ~0u);
      embed_fwd_kernel<uint4><<<grid_stride_blocks(n * chunks, kThreads), kThreads, 0, stream>>>(
          static_cast<const uint4*>(table), num, chunks, idx, n, static_cast<uint4*>(out), nan_bits);
    } else {
      using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint16_t>;
      embed_fwd_kernel<U><<<grid_stride_blocks(n * dim, kThreads), kThreads, 0, stream>>>(
          static_cast<const U*>(table), num, dim, idx, n, static_cast<U*>(out), static_cast<U>(~U{0}));
    }
    BT_KERNEL_CHECK();
  });
}

size_t embedding_backward_scratch_floats(int64_t n, int64_t num) {
  if (n <= 0 || num <= 0) return 0;
  BT_CHECK(n < INT_MAX, "cuda embedding_backward: ", n, " indices are too many (at most ", INT_MAX - 1, ")");
  const size_t bytes = 4 * align256(static_cast<size_t>(n) * 4) + cub_sort_bytes(n, num);
  return (bytes + sizeof(float) - 1) / sizeof(float);
}

void embedding_backward(DType dt, DType out_dt, const void* dout, const int32_t* idx, int64_t n, int64_t num,
                        int64_t dim, void* dtable, bool accumulate, float* scratch, cudaStream_t stream) {
  check_sizes("embedding_backward", num, dim, n);
  const bool wide = widens(dt, out_dt, "cuda embedding_backward");
  dispatch_float(dt, "embedding_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (num == 0 || dim == 0) return;
    BT_CHECK(dtable != nullptr, "cuda embedding_backward: null dtable");
    const size_t out_size = wide ? sizeof(float) : sizeof(T);
    if (!accumulate)
      BT_CUDA_CHECK(cudaMemsetAsync(dtable, 0, static_cast<size_t>(num * dim) * out_size, stream));
    if (n == 0) return;
    BT_CHECK(dout != nullptr && idx != nullptr, "cuda embedding_backward: null dout or indices");
    BT_CHECK(scratch != nullptr,
             "cuda embedding_backward: null scratch (allocate embedding_backward_scratch_floats(", n, ", ",
             num, ") floats)");
    const SortSpace s = sort_space(scratch, n, num);
    embed_sort_keys_kernel<<<static_cast<unsigned>(ceil_div(n, 256)), 256, 0, stream>>>(idx, n, num,
                                                                                        s.keys_in, s.pos_in);
    BT_KERNEL_CHECK();
    size_t cub_bytes = s.cub_bytes;
    BT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(s.cub, cub_bytes, s.keys_in, s.keys_out, s.pos_in,
                                                  s.pos_out, static_cast<int>(n), 0, key_bits(num), stream));
    constexpr int V = kVec16<T>;
    const bool vec = dim % V == 0 && aligned_to(dout, 16) && aligned_to(dtable, V * out_size);
    auto run = [&](auto* out) {
      if (vec)
        launch_runs<T, std::remove_pointer_t<decltype(out)>, V>(static_cast<const T*>(dout), s, n, num, dim,
                                                                out, accumulate, stream);
      else
        launch_runs<T, std::remove_pointer_t<decltype(out)>, 1>(static_cast<const T*>(dout), s, n, num, dim,
                                                                out, accumulate, stream);
    };
    if (wide)
      run(static_cast<float*>(dtable));
    else
      run(static_cast<T*>(dtable));
  });
}

}  // namespace bt::kernels::cuda
