// Helpers shared by the GPU kernel tests (tests/kernels/cuda): device buffer
// RAII, host buffers of any dtype, random data (seeded with BT_SEED,
// tests/support/seed.h), upload/download, NaN poisoning and the relative-error
// metric. Every test compares a CUDA kernel with the CPU kernel of the same
// header on identical input bytes.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "kernels/common/cuda_check.h"
#include "kernels/common/dtype.h"
#include "kernels/common/error.h"
#include "tests/support/seed.h"  // BT_SEED: a fresh seed per run, replayable with BT_TEST_SEED

namespace bt::test::gpu {

inline bool has_cuda() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return n > 0;
}

/// First statement of every GPU test.
#define BT_SKIP_WITHOUT_GPU()                                           \
  do {                                                                  \
    if (!::bt::test::gpu::has_cuda()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

/// Waits for the device and reports asynchronous kernel errors.
inline void sync() { BT_CUDA_CHECK(cudaDeviceSynchronize()); }

// ------------------------------------------------------------ host buffers
/// Stores `x` into element i of a raw buffer of dtype dt (test-data helper:
/// the exact rounding does not matter, both devices read the same bytes).
inline void store_as(DType dt, void* base, int64_t i, double x) {
  unsigned char* p = static_cast<unsigned char*>(base) + i * static_cast<int64_t>(dtype_size(dt));
  switch (dt) {
    case DType::F32: {
      const float f = static_cast<float>(x);
      std::memcpy(p, &f, 4);
      break;
    }
    case DType::F64:
      std::memcpy(p, &x, 8);
      break;
    case DType::BF16: {
      const uint16_t h = float_to_bf16_bits(static_cast<float>(x));
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::F16: {
      const uint16_t h = float_to_f16_bits(static_cast<float>(x));
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::I32: {
      const int32_t v = static_cast<int32_t>(x);
      std::memcpy(p, &v, 4);
      break;
    }
    case DType::I64: {
      const int64_t v = static_cast<int64_t>(x);
      std::memcpy(p, &v, 8);
      break;
    }
    case DType::U16: {
      const uint16_t v = static_cast<uint16_t>(x);
      std::memcpy(p, &v, 2);
      break;
    }
    case DType::U8: {
      const uint8_t v = static_cast<uint8_t>(x);
      std::memcpy(p, &v, 1);
      break;
    }
    case DType::Bool: {
      const uint8_t v = x != 0.0 ? 1 : 0;
      std::memcpy(p, &v, 1);
      break;
    }
  }
}

inline double load_as(DType dt, const void* base, int64_t i) {
  const unsigned char* p = static_cast<const unsigned char*>(base) + i * static_cast<int64_t>(dtype_size(dt));
  switch (dt) {
    case DType::F32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::F64: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    case DType::BF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return bf16_bits_to_float(h);
    }
    case DType::F16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return f16_bits_to_float(h);
    }
    case DType::I32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::I64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return static_cast<double>(v);
    }
    case DType::U16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case DType::U8:
    case DType::Bool: {
      uint8_t v;
      std::memcpy(&v, p, 1);
      return v;
    }
  }
  return 0.0;
}

/// A host buffer of `n` elements of `dt`, as the kernels see it.
struct HostBuf {
  DType dt = DType::F32;
  int64_t n = 0;
  std::vector<unsigned char> bytes;

  HostBuf() = default;
  HostBuf(DType t, int64_t count)
      : dt(t), n(count), bytes(static_cast<size_t>(count > 0 ? count : 0) * dtype_size(t)) {}
  HostBuf(DType t, const std::vector<double>& v) : HostBuf(t, static_cast<int64_t>(v.size())) {
    for (int64_t i = 0; i < n; ++i) set(i, v[static_cast<size_t>(i)]);
  }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  size_t size_bytes() const { return bytes.size(); }
  void set(int64_t i, double x) { store_as(dt, bytes.data(), i, x); }
  double get(int64_t i) const { return load_as(dt, bytes.data(), i); }
  std::vector<double> vals() const {
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = get(i);
    return v;
  }
  template <class T>
  T* as() {
    return reinterpret_cast<T*>(bytes.data());
  }
  template <class T>
  const T* as() const {
    return reinterpret_cast<const T*>(bytes.data());
  }
};

inline std::vector<double> uniform_vals(size_t n, std::mt19937& gen, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

inline std::vector<double> normal_vals(size_t n, std::mt19937& gen, double stddev = 1.0) {
  std::normal_distribution<double> d(0.0, stddev);
  std::vector<double> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

inline HostBuf random_buf(DType dt, int64_t n, std::mt19937& gen, double lo = -1.0, double hi = 1.0) {
  return HostBuf(dt, uniform_vals(static_cast<size_t>(n), gen, lo, hi));
}
inline HostBuf randn_buf(DType dt, int64_t n, std::mt19937& gen, double stddev = 1.0) {
  return HostBuf(dt, normal_vals(static_cast<size_t>(n), gen, stddev));
}

// ------------------------------------------------------------ device buffers
/// Owning device allocation (never zero-sized, so the pointer is never null).
class DevBuf {
 public:
  DevBuf() = default;
  explicit DevBuf(size_t bytes) : bytes_(bytes) { BT_CUDA_CHECK(cudaMalloc(&ptr_, bytes > 0 ? bytes : 16)); }
  explicit DevBuf(const HostBuf& h) : DevBuf(h.size_bytes()) { upload(h.data(), h.size_bytes()); }
  ~DevBuf() {
    if (ptr_) cudaFree(ptr_);
  }
  DevBuf(DevBuf&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DevBuf& operator=(DevBuf&& o) noexcept {
    if (this != &o) {
      if (ptr_) cudaFree(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;

  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

  void upload(const void* src, size_t n) {
    if (n) BT_CUDA_CHECK(cudaMemcpy(ptr_, src, n, cudaMemcpyHostToDevice));
  }
  void download(void* dst, size_t n) const {
    sync();
    if (n) BT_CUDA_CHECK(cudaMemcpy(dst, ptr_, n, cudaMemcpyDeviceToHost));
  }
  /// Fills every byte with 0xFF: NaN for f32/bf16, so unwritten outputs fail.
  void poison() { BT_CUDA_CHECK(cudaMemset(ptr_, 0xFF, bytes_ > 0 ? bytes_ : 16)); }

  /// The first `n` elements of `dt`, copied back to the host.
  HostBuf to_host(DType dt, int64_t n) const {
    HostBuf h(dt, n);
    download(h.data(), h.size_bytes());
    return h;
  }
  template <class T>
  std::vector<T> to_vector(size_t n) const {
    std::vector<T> v(n);
    download(v.data(), n * sizeof(T));
    return v;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// A device buffer holding a copy of `v`.
template <class T>
DevBuf upload_vector(const std::vector<T>& v) {
  DevBuf d(v.size() * sizeof(T));
  d.upload(v.data(), v.size() * sizeof(T));
  return d;
}

// ------------------------------------------------------------ comparisons
/// ||out - ref|| / ||ref|| (absolute norm when ref is all zero). Any NaN or inf
/// in `out` that is not the same value in `ref` gives +inf, so NaN never passes.
inline double rel_error(const std::vector<double>& out, const std::vector<double>& ref) {
  if (out.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double o = out[i], r = ref[i];
    if (!std::isfinite(o) || !std::isfinite(r)) {
      const bool same = (std::isnan(o) && std::isnan(r)) || o == r;
      if (!same || std::isnan(o)) return std::numeric_limits<double>::infinity();
      continue;  // equal infinities
    }
    num += (o - r) * (o - r);
    den += r * r;
  }
  if (den == 0.0) return std::sqrt(num);
  return std::sqrt(num / den);
}

template <class T>
std::vector<double> to_doubles(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

/// Tolerance for ||out - ref|| / ||ref|| by dtype: f32 1e-5, bf16 1e-2.
inline double tol(DType dt) { return dt == DType::BF16 ? 1e-2 : 1e-5; }

// Note [Tolerance of a sum]
// A sum of n terms of both signs is about the root-sum-square of its terms in
// size, but cancellation can leave it much smaller while its rounding error
// stays what it was: measured against the sum itself, the error of a sum that
// happened to come out small has no bound (CudaLayerNorm.MatchesCpu's db of
// one column summed over 1000 rows, f32 against the CPU's other order, was
// 1.4e-5 of itself on seed 2016363834). Sums are held to their terms' scale.

/// ||out - ref|| / ||scale||, where scale[i] is the root-sum-square of the
/// terms summed into ref[i]; +inf on a size mismatch or a non-finite value.
inline double sum_error(const std::vector<double>& out, const std::vector<double>& ref,
                        const std::vector<double>& scale) {
  if (out.size() != ref.size() || scale.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i]) || !std::isfinite(ref[i])) return std::numeric_limits<double>::infinity();
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += scale[i] * scale[i];
  }
  return den == 0.0 ? std::sqrt(num) : std::sqrt(num / den);
}

/// Expects sum_error(out, ref, scale) < tolerance (Note [Tolerance of a sum]).
#define BT_EXPECT_SUM_REL(out, ref, scale, tolerance, what)                                      \
  do {                                                                                           \
    const double bt_err_ = ::bt::test::gpu::sum_error((out), (ref), (scale));                    \
    EXPECT_LT(bt_err_, (tolerance)) << (what) << ": error against the terms' scale " << bt_err_; \
  } while (0)

/// Expects rel_error(out, ref) < tolerance, naming `what` in the failure.
#define BT_EXPECT_REL(out, ref, tolerance, what)                                 \
  do {                                                                           \
    const double bt_err_ = ::bt::test::gpu::rel_error((out), (ref));             \
    EXPECT_LT(bt_err_, (tolerance)) << (what) << ": relative error " << bt_err_; \
  } while (0)

/// Index of the first differing element of two byte buffers of `es`-byte elements, or -1.
inline int64_t first_byte_mismatch(const std::vector<unsigned char>& a, const std::vector<unsigned char>& b,
                                   size_t es) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<int64_t>(i / es);
  return -1;
}

}  // namespace bt::test::gpu
