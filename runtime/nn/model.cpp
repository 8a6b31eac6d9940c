#include "runtime/nn/model.h"

#include "kernels/common/error.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/core/precision.h"
#include "runtime/core/profiler.h"
#include "runtime/nn/kv_cache.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/nn/cross_entropy.h"
#include "runtime/ops/nn/linear_cross_entropy.h"

namespace bt::nn {

Model::Model(const ModelConfig& cfg, const Device& device) : cfg_(cfg), device_(device) { cfg_.validate(); }

std::vector<Tensor> Model::parameters() const {
  std::vector<Tensor> out;
  for (const auto& [name, t] : params_) out.push_back(t);
  return out;
}

Tensor Model::add_param(const std::string& name, const Shape& shape, int unit, Init init, ParamInfo pi,
                        Generator& g) {
  BT_ASSERT(index_.count(name) == 0, "duplicate parameter name ", name);
  const TensorOptions o{DType::F32, device_};
  Tensor t = init.std > 0 ? normal(shape, 0.0, init.std, o, &g) : full(shape, init.fill, o);
  t.requires_grad_();
  index_.emplace(name, params_.size());
  params_.emplace_back(name, t);
  units_.push_back(unit);
  infos_.push_back(pi);
  return t;
}

const Model::ParamInfo& Model::info(const std::string& name) const {
  const auto it = index_.find(name);
  BT_CHECK(it != index_.end(), "the ", cfg_.arch, " model has no parameter named '", name, "'");
  return infos_[it->second];
}

Tensor Model::compute(const Tensor& p) const {
  if (source_) return source_->weight(p);
  return precision() == Precision::BF16 ? p.to(DType::BF16) : p;
}

Tensor Model::f32(const Tensor& p) const { return source_ ? source_->weight(p) : p; }

void Model::enter(int unit) const {
  if (source_) source_->enter(unit);
}

std::vector<Tensor> Model::leave(int unit, const std::vector<Tensor>& outs) const {
  return source_ ? source_->leave(unit, outs) : outs;
}

void Model::check_ids(const Tensor& idx, int64_t first) const {
  BT_CHECK(idx.dim() == 2 && idx.dtype() == DType::I32, "model forward: token ids must be i32 [B, T], got ",
           idx.dtype(), " ", shape_str(idx.shape()));
  const int64_t T = idx.size(1);
  BT_CHECK(T >= 1 && first + T <= cfg_.seq_len, "model forward: positions [", first, ", ", first + T,
           ") are outside [0, model.seq_len=", cfg_.seq_len, ")");
  BT_CHECK(idx.device() == device_, "model forward: token ids are on ", idx.device(), " but the model is on ",
           device_);
}

Tensor Model::head_logits(const Tensor& h, const Tensor& head) const {
  ProfileScope prof("head");
  return leave(0, linear(h, head));
}

Tensor Model::forward(const Tensor& idx) const {
  Tensor head;
  const Tensor h = hidden(idx, head, nullptr);
  return head_logits(h, head);
}

Tensor Model::forward_cached(const Tensor& idx, KvCache& cache) const {
  NoGradGuard ng;
  Tensor head;
  const Tensor h = hidden(idx, head, &cache);
  cache.advance(idx.size(-1));
  return head_logits(h, head);
}

Tensor Model::loss(const Tensor& idx, const Tensor& targets, float grad_hint) const {
  BT_CHECK(targets.shape() == idx.shape(), "model loss: targets ", shape_str(targets.shape()),
           " must have the shape of the inputs ", shape_str(idx.shape()));
  Tensor head;
  const Tensor h = hidden(idx, head, nullptr);
  const int64_t chunk = lm_head_chunk_rows(cfg_.padded_vocab(), head.dtype(), matmul_math(precision()));
  if (chunk == 0) {  // BT_HEAD_CHUNK_MIB=0: the logits whole
    Tensor logits = head_logits(h, head);
    ProfileScope prof("cross_entropy");
    Tensor flat = logits.view({-1, logits.size(-1)});
    logits = Tensor();  // the loss consumes the logits (Note [Gradient in the forward pass])
    return cross_entropy(std::move(flat), targets.reshape({-1}), cfg_.vocab_size, grad_hint);
  }
  ProfileScope prof("head_and_loss");  // Note [The LM head in row chunks]
  Tensor loss = linear_cross_entropy(h.reshape({-1, h.size(-1)}), head, targets.reshape({-1}),
                                     cfg_.vocab_size, grad_hint, chunk);
  return leave(0, loss);
}

}  // namespace bt::nn
