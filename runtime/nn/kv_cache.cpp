#include "runtime/nn/kv_cache.h"

#include <cmath>
#include <limits>

#include "kernels/common/error.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/nn/attention.h"
#include "runtime/ops/softmax.h"
#include "runtime/tensor/factory.h"

namespace bt::nn {

KvCache::KvCache(const ModelConfig& cfg, int64_t batch, int64_t capacity)
    : layers_(cfg.n_layer),
      batch_(batch),
      capacity_(capacity > 0 ? capacity : cfg.seq_len),
      heads_(cfg.kv_heads()),
      dim_(cfg.head_dim()),
      k_(static_cast<size_t>(cfg.n_layer)),
      v_(static_cast<size_t>(cfg.n_layer)) {
  BT_CHECK(batch > 0, "KvCache: batch must be > 0, got ", batch);
  BT_CHECK(capacity_ <= cfg.seq_len, "KvCache: capacity ", capacity_, " exceeds model.seq_len=", cfg.seq_len);
}

std::pair<Tensor, Tensor> KvCache::append(int64_t layer, const Tensor& k, const Tensor& v) {
  BT_CHECK(layer >= 0 && layer < layers_, "KvCache: layer ", layer, " is outside [0, ", layers_, ")");
  const Shape want{batch_, k.size(1), heads_, dim_};
  BT_CHECK(k.shape() == want && v.shape() == want, "KvCache: keys ", shape_str(k.shape()), " and values ",
           shape_str(v.shape()), " must be ", shape_str(want));
  const int64_t n = k.size(1);
  BT_CHECK(length_ + n <= capacity_, "KvCache: ", n, " more positions overflow the cache (", length_, " of ",
           capacity_, " used)");
  Tensor& K = k_[static_cast<size_t>(layer)];
  Tensor& V = v_[static_cast<size_t>(layer)];
  if (!K.defined() || K.dtype() != k.dtype() || K.device() != k.device()) {
    K = empty({batch_, capacity_, heads_, dim_}, TensorOptions{k.dtype(), k.device()});
    V = empty({batch_, capacity_, heads_, dim_}, TensorOptions{v.dtype(), v.device()});
  }
  K.narrow(1, length_, n).copy_(k);
  V.narrow(1, length_, n).copy_(v);
  return {K.narrow(1, 0, length_ + n), V.narrow(1, 0, length_ + n)};
}

void KvCache::advance(int64_t n) {
  BT_CHECK(n >= 0 && length_ + n <= capacity_, "KvCache: cannot advance ", n, " positions from ", length_,
           " of ", capacity_);
  length_ += n;
}

Tensor cached_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t first) {
  const int64_t B = q.size(0), n = q.size(1), H = q.size(2), D = q.size(3), Hkv = k.size(2);
  const int64_t L = k.size(1);
  BT_CHECK(L == first + n && H % Hkv == 0, "cached_attention: ", n, " queries at position ", first,
           " need keys of ", first + n, " positions, got ", shape_str(k.shape()));
  if (first == 0) return grouped_query_attention(q, k, v);
  const int64_t G = H / Hkv;
  // Query heads h = kv * G + g: [B, Hkv, G * n, D], rows g * n + i.
  const Tensor qg = q.reshape({B, n, Hkv, G, D}).permute({0, 2, 3, 1, 4}).reshape({B, Hkv, G * n, D});
  const Tensor kt = k.permute({0, 2, 3, 1}).contiguous();  // [B, Hkv, D, L]
  Tensor s = mul(matmul(qg, kt), 1.0 / std::sqrt(static_cast<double>(D)));
  if (n > 1) {  // query i sits at first + i and sees keys 0 .. first + i
    std::vector<float> m(static_cast<size_t>(G * n * L), 0.0f);
    for (int64_t r = 0; r < G * n; ++r)
      for (int64_t j = first + r % n + 1; j < L; ++j)
        m[static_cast<size_t>(r * L + j)] = -std::numeric_limits<float>::infinity();
    s = add(s, from_vector<float>(m, {G * n, L}).to(s.device()).to(s.dtype()));
  }
  const Tensor o = matmul(softmax(s, -1), v.permute({0, 2, 1, 3}).contiguous());  // [B, Hkv, G * n, D]
  return o.view({B, Hkv, G, n, D}).permute({0, 3, 1, 2, 4}).contiguous().view({B, n, H, D});
}

}  // namespace bt::nn
