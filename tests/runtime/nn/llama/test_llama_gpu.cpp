// The Llama family on the GPU against the CPU: the same seeded model gives
// the same loss and gradients in fp32 (TF32 off), bf16 stays within bf16's
// rounding of it, and the KV cache gives the full forward's logits.
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "runtime/bt.h"
#include "runtime/core/precision.h"
#include "runtime/nn/kv_cache.h"
#include "runtime/nn/llama/llama.h"
#include "tests/kernels/cuda/gpu_test_util.h"

namespace bt::nn {
namespace {

ModelConfig config() {
  ModelConfig c = model_preset("llama-tiny");
  c.n_layer = 2;
  c.n_embd = 128;
  c.n_head = 4;  // head dim 32
  c.n_kv_head = 2;
  c.ffn_hidden = 256;
  c.seq_len = 64;
  c.vocab_size = 500;
  return c;
}

struct Result {
  float loss = 0;
  std::vector<std::vector<float>> grads;
};

Result train_once(const Device& dev, Precision p) {
  struct Restore {
    Precision p = precision();
    ~Restore() { set_precision(p); }
  } restore;
  set_precision(p);
  Llama m(config(), dev, 7);
  std::vector<int32_t> x(2 * 64), y(2 * 64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<int32_t>(i * 37 % 500), y[i] = (x[i] + 1) % 500;
  const Tensor loss =
      m.loss(from_vector<int32_t>(x, {2, 64}).to(dev), from_vector<int32_t>(y, {2, 64}).to(dev));
  loss.backward();
  Result r{loss.item<float>(), {}};
  for (const auto& [name, t] : m.named_parameters()) r.grads.push_back(t.grad().cpu().to_vector<float>());
  return r;
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) d += (a[i] - b[i]) * double(a[i] - b[i]), n += double(b[i]) * b[i];
  return std::sqrt(d / std::max(n, 1e-30));
}

TEST(LlamaGpu, Fp32MatchesTheCpu) {
  BT_SKIP_WITHOUT_GPU();
  const Result cpu = train_once(Device::cpu(), Precision::FP32),
               gpu = train_once(Device::cuda(0), Precision::FP32);
  EXPECT_NEAR(gpu.loss, cpu.loss, 1e-5 * cpu.loss);
  for (size_t i = 0; i < cpu.grads.size(); ++i)
    EXPECT_LT(rel(gpu.grads[i], cpu.grads[i]), 1e-4) << "parameter " << i;
}

TEST(LlamaGpu, Bf16StaysNearFp32) {
  BT_SKIP_WITHOUT_GPU();
  const Result f = train_once(Device::cuda(0), Precision::FP32),
               b = train_once(Device::cuda(0), Precision::BF16);
  EXPECT_NEAR(b.loss, f.loss, 0.01 * f.loss);
  for (size_t i = 0; i < f.grads.size(); ++i)
    EXPECT_LT(rel(b.grads[i], f.grads[i]), 0.1) << "parameter " << i;
}

TEST(LlamaGpu, CachedLogitsAreTheFullForwardsLogits) {
  BT_SKIP_WITHOUT_GPU();
  const Llama m(config(), Device::cuda(0), 9);
  std::vector<int32_t> seq(40);
  for (size_t i = 0; i < seq.size(); ++i) seq[i] = static_cast<int32_t>(i * 13 % 500);
  NoGradGuard ng;
  const Tensor full = m.forward(from_vector<int32_t>(seq, {1, 40}).to(Device::cuda(0))).cpu();
  KvCache cache(m.config(), 1);
  int64_t at = 0;
  for (int64_t n : {32, 3, 1, 1, 1, 1, 1}) {
    const std::vector<int32_t> part(seq.begin() + at, seq.begin() + at + n);
    const Tensor got = m.forward_cached(from_vector<int32_t>(part, {1, n}).to(Device::cuda(0)), cache).cpu();
    EXPECT_LT(rel(got.to_vector<float>(), full.narrow(1, at, n).contiguous().to_vector<float>()), 1e-5)
        << "positions " << at << "+" << n;
    at += n;
  }
}

}  // namespace
}  // namespace bt::nn
