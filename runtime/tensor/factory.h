// Creating tensors: constants, ranges, seeded random values, host data.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/tensor/tensor.h"

namespace bt {

Tensor empty(const Shape& shape, const TensorOptions& opts = {});
Tensor empty_like(const Tensor& t);
Tensor zeros(const Shape& shape, const TensorOptions& opts = {});
Tensor ones(const Shape& shape, const TensorOptions& opts = {});
Tensor full(const Shape& shape, double value, const TensorOptions& opts = {});
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
/// [0, 1, ..., n-1]
Tensor arange(int64_t n, const TensorOptions& opts = {});
/// start, start+step, ... < end
Tensor arange(double start, double end, double step, const TensorOptions& opts = {});

/// A counter-based random stream: (seed, offset). Each fill of n elements uses
/// offsets [offset, offset+n) and advances offset by n, so the same generator
/// state gives the same values on CPU and CUDA (Note [Portable RNG]).
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_state(uint64_t seed, uint64_t offset) {
    seed_ = seed;
    offset_ = offset;
  }
  /// Reserves n draws and returns the offset of the first.
  uint64_t advance(uint64_t n) {
    const uint64_t o = offset_;
    offset_ += n;
    return o;
  }

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};

/// The process-wide default generator (seed 0 until manual_seed).
Generator& default_generator();
void manual_seed(uint64_t seed);

Tensor rand(const Shape& shape, const TensorOptions& opts = {}, Generator* gen = nullptr);   // U[0, 1)
Tensor randn(const Shape& shape, const TensorOptions& opts = {}, Generator* gen = nullptr);  // N(0, 1)
Tensor uniform(const Shape& shape, double lo, double hi, const TensorOptions& opts = {},
               Generator* gen = nullptr);
Tensor normal(const Shape& shape, double mean, double std, const TensorOptions& opts = {},
              Generator* gen = nullptr);

/// Copies host values into a new tensor (converted to opts.dtype, placed on opts.device).
template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions opts);
template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape) {
  TensorOptions o;
  o.dtype = dtype_of<T>();
  return from_vector(values, shape, o);
}
/// Wraps memory owned by the caller (no copy; the caller keeps it alive).
Tensor from_blob(void* data, const Shape& shape, DType dtype, const Device& device = Device::cpu());

}  // namespace bt
