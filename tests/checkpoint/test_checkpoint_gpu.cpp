// Checkpoints of CUDA tensors (Note [Checkpoint data path]): the writer
// stages device data through pinned buffers a few blocks at a time, the
// loader reads in rounds and copies to the device. Saved from one cut of
// the pieces, loaded into another, the values come back bitwise.
#include <gtest/gtest.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/shard_file.h"
#include "runtime/bt.h"
#include "tests/support/temp_dir.h"

namespace bt::ckpt {
namespace {

dist::StatePiece piece(const std::string& name, const Tensor& t, int64_t begin, int64_t end) {
  return dist::StatePiece{name, t.shape(), begin, end, t.reshape({-1}).narrow(0, begin, end - begin)};
}

TEST(CheckpointGpu, CudaPiecesRoundTripBitwiseAcrossCuts) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  test::TempDir dir("bt_ckpt_gpu");
  const Device gpu = Device::cuda(0);
  Generator gen(7);
  const int64_t n = kCrcBlock * 9 + 12345;  // more than one staging round of 8 blocks
  const Tensor big = randn({n}, {}, &gen).to(gpu), small = randn({3, 5}, {}, &gen).to(gpu);
  SaveRequest r;
  r.root = dir.file("ck");
  r.step = 3;
  r.pieces = {piece("adam_v/big", big, 0, kCrcBlock + 7), piece("adam_v/big", big, kCrcBlock + 7, n),
              piece("param/small", small, 0, 15)};
  r.config = nlohmann::json::object();
  r.device = gpu.str();
  const std::string d = save(r, nullptr);
  EXPECT_TRUE(verify(d).empty());

  const Tensor big2 = zeros({n}, TensorOptions{}.with_device(gpu)),
               small2 = zeros({3, 5}, TensorOptions{}.with_device(gpu));
  load_pieces(d, read_index(d),
              {piece("adam_v/big", big2, 0, 5), piece("adam_v/big", big2, 5, 3 * kCrcBlock),
               piece("adam_v/big", big2, 3 * kCrcBlock, n), piece("param/small", small2, 0, 15)});
  EXPECT_EQ(big2.cpu().to_vector<float>(), big.cpu().to_vector<float>());
  EXPECT_EQ(small2.cpu().to_vector<float>(), small.cpu().to_vector<float>());
}

}  // namespace
}  // namespace bt::ckpt
