#include "runtime/ops/nn/embedding.h"

#include "kernels/embedding.h"
#include "runtime/autograd/engine.h"
#include "runtime/autograd/function.h"
#include "runtime/core/cuda_graph.h"
#include "runtime/ops/dispatch.h"
#include "runtime/tensor/factory.h"

namespace bt {
namespace {

/// CUDA: count bad indices on the device; on error, find the first on the host.
/// Not while a CUDA graph is captured, which cannot read the count back: the
/// capturing caller checks its ids on the host (the Trainer checks every
/// batch, Note [Whole-step CUDA graphs] in runtime/train/trainer.cpp).
void check_indices_cuda(const Tensor& idx, int64_t num) {
#ifdef BT_CUDA
  if (capture_underway()) return;
  Tensor bad = empty({1}, TensorOptions{DType::I32, idx.device()});
  detail::on_device(
      idx.device(), [] {},
      BT_CUDA_LAMBDA(
          kernels::cuda::count_out_of_range(idx.data<int32_t>(), idx.numel(), num, bad.data<int>(), stream)));
  if (bad.item<int32_t>() == 0) return;
  const std::vector<int32_t> h = idx.to_vector<int32_t>();
  for (size_t i = 0; i < h.size(); ++i)
    BT_CHECK(h[i] >= 0 && h[i] < num, "embedding: index ", h[i], " at position ", i, " is outside [0, ", num,
             ") (the table has ", num, " rows)");
#endif
}

}  // namespace

Tensor embedding(const Tensor& table_in, const Tensor& indices_in) {
  detail::check_defined("embedding", table_in, "table");
  detail::check_defined("embedding", indices_in, "indices");
  detail::check_dim("embedding", table_in, "table", 2);
  detail::check_dtype("embedding", table_in, "table", {DType::F32, DType::F64, DType::BF16});
  detail::check_dtype("embedding", indices_in, "indices", {DType::I32});
  detail::check_same_device("embedding", table_in, indices_in);
  Tensor table = table_in.contiguous(), idx = indices_in.contiguous();
  const int64_t num = table.size(0), dim = table.size(1), n = idx.numel();
  Shape out_shape = idx.shape();
  out_shape.push_back(dim);
  Tensor out = empty(out_shape, table.options());
  if (idx.is_cuda()) check_indices_cuda(idx, num);
  detail::on_device(
      table.device(),
      [&] {
        kernels::cpu::embedding_forward(table.dtype(), table.data_ptr(), num, dim, idx.data<int32_t>(), n,
                                        out.data_ptr());
      },
      BT_CUDA_LAMBDA(kernels::cuda::embedding_forward(table.dtype(), table.data_ptr(), num, dim,
                                                      idx.data<int32_t>(), n, out.data_ptr(), stream)));
  if (autograd::any_requires_grad({&table_in}))
    autograd::record(
        "EmbeddingBackward", {&table_in, nullptr}, out,
        [si = SavedTensor(idx, "embedding"), num, dim, n,
         dev = table.device()](autograd::Grads& g) -> autograd::Grads {
          Tensor idx = si.unpack();
          Tensor dout = g[0].contiguous();
          // Note [Gradients in a wider dtype]: a bf16 table (a cast of an f32
          // master; GPT's tied wte also gets the head's f32 gradient) gets its
          // gradient in f32, summed there directly: no scratch, no cast. Where
          // the table already has a gradient (the head's), the rows are added
          // into it (Note [Adding into the gradient so far]).
          const DType dt = dout.dtype(), gdt = dt == DType::BF16 ? DType::F32 : dt;
          Tensor dtable = autograd::gradient_so_far(0);
          const bool into = dtable.defined() && dtable.dtype() == gdt && dtable.device() == dev &&
                            dtable.shape() == Shape{num, dim};
          if (!into) dtable = empty({num, dim}, TensorOptions{gdt, dev});
          detail::on_device(
              dev,
              [&] {
                kernels::cpu::embedding_backward(dt, gdt, dout.data_ptr(), idx.data<int32_t>(), n, num, dim,
                                                 dtable.data_ptr(), into);
              },
              BT_CUDA_LAMBDA(const auto floats = static_cast<int64_t>(
                                 kernels::cuda::embedding_backward_scratch_floats(n, num));
                             Tensor scratch = empty({floats}, TensorOptions{DType::F32, dev});
                             kernels::cuda::embedding_backward(
                                 dt, gdt, dout.data_ptr(), idx.data<int32_t>(), n, num, dim,
                                 dtable.data_ptr(), into, floats ? scratch.data<float>() : nullptr, stream)));
          return {dtable, Tensor()};
        });
  return out;
}

}  // namespace bt
