// Sharded checkpoints (checkpoint/checkpoint.h) in one process: loads that
// cut the saved pieces differently, the commit protocol (no index: no
// checkpoint; `latest`; retention), corruption caught by verify and by loads,
// a tensor of another shape refused by name, a full disk during a save, and
// HDF5's own tools reading the rank files. Multi-rank saves, exact resume and
// resharding through `blutrain train`: tests/launcher/test_checkpoint_mpi.cpp.
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/shard_file.h"
#include "runtime/tensor/factory.h"
#include "tests/support/error_message.h"
#include "tests/support/fetched_data.h"
#include "tests/support/files.h"
#include "tests/support/run_command.h"
#include "tests/support/temp_dir.h"

namespace bt::ckpt {
namespace {

namespace fs = std::filesystem;
using dist::StatePiece;

/// Two global tensors, "param/a" [3, 5] and "adam_m/b" [7], with values from `seed`.
struct Globals {
  Tensor a, b;
  explicit Globals(uint64_t seed) {
    Generator g(seed);
    a = randn({3, 5}, {}, &g);
    b = randn({7}, {}, &g);
  }
};

StatePiece piece(const std::string& name, const Tensor& t, int64_t begin, int64_t end) {
  return StatePiece{name, t.shape(), begin, end, t.reshape({-1}).narrow(0, begin, end - begin)};
}

SaveRequest request(const std::string& root, int64_t step, const Globals& g) {
  SaveRequest r;
  r.root = root;
  r.step = step;
  // Cut at odd places: a in three pieces, b in one.
  r.pieces = {piece("param/a", g.a, 0, 4), piece("param/a", g.a, 4, 11), piece("param/a", g.a, 11, 15),
              piece("adam_m/b", g.b, 0, 7)};
  r.counters = {{"step", step}};
  r.rank_counters = {{"rng_seed", 1}, {"rng_offset", 2}};
  r.config = {{"model", {{"n_layer", 1}}}};
  r.device = "cpu";
  return r;
}

std::vector<float> values(const Tensor& t) { return t.contiguous().to_vector<float>(); }

TEST(Checkpoint, LoadsPiecesCutDifferentlyFromTheSavedOnes) {
  test::TempDir dir("bt_ckpt");
  const Globals saved(1);
  const std::string d = save(request(dir.file("ck"), 5, saved), nullptr);
  EXPECT_EQ(fs::path(d).filename(), "step_00000005");
  const Index idx = read_index(d);
  EXPECT_EQ(idx.step, 5);
  EXPECT_EQ(idx.world_size, 1);
  EXPECT_EQ(idx.tensors.at("param/a").pieces.size(), 3u);
  EXPECT_TRUE(idx.completeness_problems().empty());

  const Globals got(2);  // other values, overwritten by the load
  load_pieces(d, idx,
              {piece("param/a", got.a, 2, 13), piece("param/a", got.a, 0, 2), piece("param/a", got.a, 13, 15),
               piece("adam_m/b", got.b, 3, 7)});
  EXPECT_EQ(values(got.a), values(saved.a));
  const std::vector<float> b = values(got.b), want = values(saved.b), other = values(Globals(2).b);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(b[i], i < 3 ? other[i] : want[i]) << "b[" << i << "]";
  EXPECT_TRUE(verify(d).empty());
}

// Note [Files confined to their checkpoint]: an index naming a file outside
// its folder, or a rank file that is a symbolic link leading out of it, is a
// corrupt checkpoint for verify and for loads; a link inside the folder is not.
TEST(Checkpoint, FilesOutsideTheCheckpointsFolderAreRefused) {
  test::TempDir dir("bt_ckpt");
  const Globals g(1);
  const std::string d = save(request(dir.file("ck"), 1, g), nullptr);
  ASSERT_TRUE(verify(d).empty());
  const std::string index_path = d + "/index.json";
  const nlohmann::json good = nlohmann::json::parse(test::read_file(index_path));
  auto write_index = [&](const nlohmann::json& j) {
    std::ofstream(index_path, std::ios::trunc) << j.dump(1);
  };
  for (const std::string& bad :
       std::vector<std::string>{"../../../../etc/passwd", "/etc/passwd", "sub/rank_00000.h5", "..", "",
                                "a\\b", std::string("rank_00000.h5\0x", 15)}) {
    for (const bool in_rank : {false, true}) {
      SCOPED_TRACE(printable(bad) + (in_rank ? " as the rank's file" : " as a piece's file"));
      nlohmann::json j = good;
      if (in_rank)
        j["ranks"][0]["file"] = bad;
      else
        j["tensors"]["param/a"]["pieces"][1]["file"] = bad;
      write_index(j);
      const std::vector<std::string> problems = verify(d);
      ASSERT_EQ(problems.size(), 1u);
      EXPECT_NE(problems[0].find("names the file '" + printable(bad) +
                                 "', which is not a plain file name inside the checkpoint's folder"),
                std::string::npos)
          << problems[0];
      EXPECT_NE(problems[0].find(in_rank ? "rank 0" : "piece param/a/4 of tensor param/a"), std::string::npos)
          << problems[0];
      EXPECT_THROW(read_index(d), Error);
    }
  }
  write_index(good);
  ASSERT_TRUE(verify(d).empty());

  // The rank file moved out of the folder and linked back: refused, by verify and by a load.
  const std::string rank_file = d + "/rank_00000.h5", outside = dir.file("elsewhere.h5");
  fs::rename(rank_file, outside);
  fs::create_symlink(outside, rank_file);
  const std::vector<std::string> problems = verify(d);
  ASSERT_FALSE(problems.empty());
  EXPECT_NE(problems[0].find("is a symbolic link to '" + fs::weakly_canonical(outside).string() +
                             "', outside the checkpoint's folder"),
            std::string::npos)
      << problems[0];
  const Globals got(2);
  const std::string msg =
      test::error_message([&] { load_pieces(d, read_index(d), {piece("param/a", got.a, 0, 15)}); });
  EXPECT_NE(msg.find("outside the checkpoint's folder"), std::string::npos) << msg;
  // A link to a file inside the folder is only a name.
  fs::remove(rank_file);
  fs::rename(outside, d + "/data.h5");
  fs::create_symlink("data.h5", rank_file);
  EXPECT_TRUE(verify(d).empty());
}

// A FIFO or a folder in a rank file's place is refused before it is opened:
// opening a FIFO for reading would wait for a writer forever.
TEST(Checkpoint, ARankFileThatIsNotARegularFileIsRefused) {
  test::TempDir dir("bt_ckpt");
  const Globals g(1);
  const std::string d = save(request(dir.file("ck"), 1, g), nullptr);
  const std::string rank_file = d + "/rank_00000.h5";
  for (const bool fifo : {true, false}) {
    SCOPED_TRACE(fifo ? "a FIFO" : "a folder");
    fs::remove(rank_file);
    if (fifo)
      ASSERT_EQ(mkfifo(rank_file.c_str(), 0600), 0) << std::strerror(errno);
    else
      fs::create_directory(rank_file);
    const std::vector<std::string> found = verify(d);
    ASSERT_FALSE(found.empty());
    EXPECT_NE(found[0].find("checkpoint file '" + rank_file + "' is not a regular file"), std::string::npos)
        << found[0];
    const Globals got(1);
    const std::string why =
        test::error_message([&] { load_pieces(d, read_index(d), {piece("param/a", got.a, 0, 15)}); });
    EXPECT_NE(why.find("is not a regular file"), std::string::npos) << why;
  }
}

// Note [Integers from an index]: a number an index holds that is not an
// integer of its field's range -- a float, one too large, a negative element
// count, a shape whose size overflows -- is a corrupt checkpoint, named by
// verify and refused by read_index, not undefined behaviour (libFuzzer found
// a crc32 of 3.59e10: tests/fuzz/corpus/ckpt_index/regression_crc32_float.json).
TEST(Checkpoint, NumbersOutsideTheirRangeAreACorruptIndex) {
  test::TempDir dir("bt_ckpt");
  const Globals g(1);
  const std::string d = save(request(dir.file("ck"), 1, g), nullptr);
  const std::string index_path = d + "/index.json";
  const nlohmann::json good = nlohmann::json::parse(test::read_file(index_path));
  const auto piece = [](nlohmann::json& j) -> nlohmann::json& {
    return j["tensors"]["param/a"]["pieces"][0];
  };
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[&](nlohmann::json& j) { piece(j)["crc32"] = 3.59125e10; }, "crc32 is 35912500000.0, not an integer"},
      {[&](nlohmann::json& j) { piece(j)["crc32"] = 4294967296LL; }, "crc32 is 4294967296, not an integer"},
      {[&](nlohmann::json& j) { piece(j)["end"] = 1e300; }, "end is 1e+300, not an integer"},
      {[&](nlohmann::json& j) { j["world"]["size"] = 1LL << 40; },
       "world size is 1099511627776, not an integer"},
      {[&](nlohmann::json& j) { j["counters"]["step"] = "ten"; }, "counter step is \"ten\", not an integer"},
      {[&](nlohmann::json& j) {
         j["tensors"]["param/a"]["shape"] = {1LL << 40, 1LL << 40};
       },
       "not a tensor's shape"},
      {[&](nlohmann::json& j) { j["tensors"]["param/a"]["shape"] = {-3}; }, "not a tensor's shape"},
  };
  for (const auto& [spoil, want] : cases) {
    nlohmann::json j = good;
    spoil(j);
    std::ofstream(index_path, std::ios::trunc) << j.dump(1);
    const std::vector<std::string> problems = verify(d);
    ASSERT_EQ(problems.size(), 1u) << want;
    EXPECT_NE(problems[0].find(want), std::string::npos) << problems[0];
    EXPECT_NE(problems[0].find("the checkpoint is corrupt"), std::string::npos) << problems[0];
    EXPECT_THROW(read_index(d), Error) << want;
  }
}

// The commit merges each rank's fragment (rank_RRRRR.json) into the index
// (Index::merge_fragment, a libFuzzer target: tests/fuzz/fuzz_ckpt_fragment.cpp):
// one it cannot trust is a corrupt checkpoint named by its path, never a raw
// JSON exception or a tensor whose shape depends on which rank came last.
TEST(Checkpoint, AFragmentTheCommitCannotTrustIsRefused) {
  using nlohmann::json;
  const auto fragment = [](int rank, json shape, int64_t begin, int64_t end) {
    const std::string file = rank == 0 ? "rank_00000.h5" : "rank_00001.h5";
    return json{{"rank", rank},
                {"file", file},
                {"device", "cpu"},
                {"counters", {{"rng", 1}}},
                {"pieces",
                 {{{"name", "param/w"},
                   {"shape", shape},
                   {"file", file},
                   {"dataset", "param/w/" + std::to_string(begin)},
                   {"begin", begin},
                   {"end", end},
                   {"crc32", 7}}}}};
  };
  ckpt::Index good;
  good.merge_fragment(fragment(0, {10}, 0, 6), 0, "r0.json");
  good.merge_fragment(fragment(1, {10}, 6, 10), 1, "r1.json");
  good.world_size = 2;
  good.sort_pieces();
  EXPECT_TRUE(good.completeness_problems().empty());
  ASSERT_EQ(good.ranks.size(), 2u);
  EXPECT_EQ(good.ranks[1].file, "rank_00001.h5");

  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& f) { f["shape"] = 1; }, ""},  // a key the commit does not read
      {[](json& f) {
         f["pieces"][0]["shape"] = {5, 2};
       },
       "an earlier piece of it with shape [10]"},
      {[](json& f) { f["pieces"][0]["shape"] = {-10}; }, "not a tensor's shape"},
      {[](json& f) { f["file"] = "../../outside.h5"; }, "not a plain file name"},
      {[](json& f) { f["pieces"][0]["file"] = "/etc/passwd"; }, "not a plain file name"},
      {[](json& f) { f["rank"] = 0; }, "says it is rank 0"},
      {[](json& f) { f["counters"]["rng"] = "x"; }, "rank counter rng is \"x\", not an integer"},
      {[](json& f) { f["pieces"] = 3; }, "malformed fragment of rank 1"},
      {[](json& f) { f["pieces"][0].erase("name"); }, "malformed fragment of rank 1"},
      {[](json& f) { f = json::array(); }, "must be a JSON object"},
  };
  for (const auto& [spoil, want] : cases) {
    ckpt::Index idx;
    idx.merge_fragment(fragment(0, {10}, 0, 6), 0, "r0.json");
    json f = fragment(1, {10}, 6, 10);
    spoil(f);
    if (want.empty()) {
      EXPECT_NO_THROW(idx.merge_fragment(f, 1, "ck/rank_00001.json"));
      continue;
    }
    const std::string msg = test::error_message([&] { idx.merge_fragment(f, 1, "ck/rank_00001.json"); });
    EXPECT_NE(msg.find("ck/rank_00001.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(want), std::string::npos) << want << ": " << msg;
    EXPECT_NE(msg.find("the checkpoint is corrupt"), std::string::npos) << msg;
  }
}

TEST(Checkpoint, AShareWithAGapIsNeverCommitted) {
  test::TempDir dir("bt_ckpt");
  const Globals g(1);
  SaveRequest r = request(dir.file("ck"), 5, g);
  r.pieces.erase(r.pieces.begin() + 1);  // a's elements [4, 11) missing
  const std::string msg = test::error_message([&] { save(r, nullptr); });
  EXPECT_NE(msg.find("would be incomplete"), std::string::npos) << msg;
  EXPECT_NE(msg.find("param/a"), std::string::npos) << msg;
  EXPECT_TRUE(list(dir.file("ck")).empty());
  EXPECT_FALSE(fs::exists(dir.file("ck/step_00000005.tmp"))) << "the temporary directory is removed";
}

TEST(Checkpoint, LatestSkipsUnfinishedSavesAndRetentionKeepsLastAndEveryM) {
  test::TempDir dir("bt_ckpt");
  const std::string root = dir.file("ck");
  const Globals g(1);
  for (int64_t step : {2, 4, 6}) save(request(root, step, g), nullptr);
  EXPECT_EQ(fs::path(latest(root)).filename(), "step_00000006");
  // A save that died before its rename, and a directory without an index.
  fs::create_directories(root + "/step_00000008.tmp");
  fs::create_directories(root + "/step_00000010");
  EXPECT_EQ(fs::path(latest(root)).filename(), "step_00000006");
  EXPECT_EQ(list(root).size(), 3u);
  // `latest` still naming an older one (a job that died between the rename
  // and the pointer update): the newest complete one wins.
  std::ofstream(root + "/latest") << "step_00000002\n";
  EXPECT_EQ(fs::path(latest(root)).filename(), "step_00000006");

  // keep_last 2 plus every multiple of 4: 2 goes; 4 stays (multiple); 6 and 8 are the last two.
  SaveRequest r = request(root, 8, g);
  r.keep_last = 2;
  r.keep_every = 4;
  save(r, nullptr);
  std::vector<std::string> names;
  for (const std::string& p : list(root)) names.push_back(fs::path(p).filename().string());
  EXPECT_EQ(names, (std::vector<std::string>{"step_00000004", "step_00000006", "step_00000008"}));
  EXPECT_FALSE(fs::exists(root + "/step_00000008.tmp")) << "a new save removes stale temporaries";
  EXPECT_EQ(test::read_file(root + "/latest"), "step_00000008\n");
}

/// XORs the byte at `at` of `file` with `mask`.
void flip_byte(const std::string& file, std::streamoff at, char mask) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  char c = 0;
  f.seekg(at);
  f.read(&c, 1);
  c = static_cast<char>(c ^ mask);
  f.seekp(at);
  f.write(&c, 1);
}

/// Flips one byte in the middle of the largest piece's data.
void flip_a_data_byte(const std::string& file) {
  flip_byte(file, static_cast<std::streamoff>(fs::file_size(file) / 2), 0x10);
}

TEST(Checkpoint, AFlippedByteIsCaughtByVerifyAndByLoads) {
  test::TempDir dir("bt_ckpt");
  Generator gen(3);
  const Tensor big = randn({1 << 18}, {}, &gen);  // 1 MiB: most of the file is its data
  SaveRequest r;
  r.root = dir.file("ck");
  r.step = 1;
  r.pieces = {piece("param/big", big, 0, big.numel())};
  r.config = nlohmann::json::object();
  const std::string d = save(r, nullptr);
  ASSERT_TRUE(verify(d).empty());
  flip_a_data_byte(d + "/rank_00000.h5");

  const std::vector<std::string> problems = verify(d);
  ASSERT_FALSE(problems.empty()) << "verify must notice the flipped byte";
  EXPECT_NE(problems[0].find("rank_00000.h5"), std::string::npos) << problems[0];
  EXPECT_NE(problems[0].find("param/big/0"), std::string::npos) << problems[0];
  Tensor into = zeros({1 << 18});
  bool incompatible = false;
  const std::string msg = test::error_message([&] {
    try {
      load_pieces(d, read_index(d), {piece("param/big", into, 1000, 200000)});  // a partial read too
    } catch (const Incompatible&) {
      incompatible = true;
      throw;
    }
  });
  EXPECT_FALSE(incompatible) << "corruption is not an incompatibility (resume falls back on it)";
  EXPECT_NE(msg.find("corrupt"), std::string::npos) << msg;
}

/// The file offset of element `at` of dataset `name` (a contiguous one).
uint64_t offset_of(const std::string& file, const std::string& name, int64_t at) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t d = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
  const haddr_t base = H5Dget_offset(d);
  H5Dclose(d);
  H5Fclose(f);
  EXPECT_NE(base, HADDR_UNDEF);
  return base + static_cast<uint64_t>(at) * 4;
}

// Note [Checkpoint data path]: a piece of 2.5 blocks has three block crc32s
// (and its whole crc32 is theirs combined); a flipped byte in the third block
// fails exactly the reads that touch that block.
TEST(Checkpoint, EachBlockChecksumGuardsThePartialReadsThatTouchIt) {
  test::TempDir dir("bt_ckpt");
  Generator gen(4);
  const int64_t n = kCrcBlock * 5 / 2;
  const Tensor big = randn({n}, {}, &gen);
  SaveRequest r;
  r.root = dir.file("ck");
  r.step = 1;
  r.pieces = {piece("param/big", big, 0, n)};
  r.config = nlohmann::json::object();
  const std::string d = save(r, nullptr);
  const Index idx = read_index(d);
  const SavedPiece& saved = idx.tensors.at("param/big").pieces.at(0);
  ASSERT_EQ(saved.block, kCrcBlock);
  ASSERT_EQ(saved.block_crc32.size(), 3u);
  const std::vector<float> want = values(big);
  EXPECT_EQ(saved.crc32, crc32_of(want.data(), n));
  EXPECT_EQ(saved.block_crc32[2], crc32_of(want.data() + 2 * kCrcBlock, n - 2 * kCrcBlock));

  const std::string file = d + "/rank_00000.h5";
  const uint64_t at = offset_of(file, "param/big/0", 2 * kCrcBlock + 12345);
  flip_byte(file, static_cast<std::streamoff>(at), 0x01);
  Tensor into = zeros({n});
  load_pieces(d, read_index(d), {piece("param/big", into, 100, 2 * kCrcBlock)});  // blocks 0 and 1: sound
  const std::vector<float> got = values(into);
  for (int64_t i : {int64_t{100}, kCrcBlock, 2 * kCrcBlock - 1}) EXPECT_EQ(got[i], want[i]) << i;
  const std::string msg = test::error_message([&] {
    load_pieces(d, read_index(d), {piece("param/big", into, 2 * kCrcBlock + 5, 2 * kCrcBlock + 9)});
  });
  EXPECT_NE(msg.find(cat("elements [", 2 * kCrcBlock, ", ", n, ") do not match their crc32")),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("param/big/0"), std::string::npos) << msg;
  EXPECT_EQ(verify(d).size(), 1u);
}

/// Rewrites checkpoint `d` (one rank) as format version 1 wrote it: chunked
/// datasets with Fletcher-32, one crc32 per piece in the index.
void rewrite_as_version_1(const std::string& d) {
  Index idx = read_index(d);
  const std::string file = d + "/rank_00000.h5";
  std::vector<std::pair<std::string, std::vector<float>>> data;
  {
    ShardReader reader(d);
    for (auto& [name, t] : idx.tensors)
      for (SavedPiece& p : t.pieces) {
        data.emplace_back(p.dataset, std::vector<float>(static_cast<size_t>(p.end - p.begin)));
        reader.read({{&p, p.begin, p.end, data.back().second.data()}});
        p.block = 0;
        p.block_crc32.clear();
      }
  }
  fs::remove(file);
  const hid_t f = H5Fcreate(file.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
  const hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  for (const auto& [name, v] : data) {
    const hsize_t dims[1] = {v.size()}, chunk[1] = {2};
    const hid_t space = H5Screate_simple(1, dims, nullptr), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, chunk);
    H5Pset_fletcher32(dcpl);
    const hid_t ds = H5Dcreate2(f, name.c_str(), H5T_IEEE_F32LE, space, lcpl, dcpl, H5P_DEFAULT);
    ASSERT_GE(ds, 0) << name;
    H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(space);
  }
  H5Pclose(lcpl);
  H5Fclose(f);
  nlohmann::json j = idx.to_json();
  j["version"] = 1;
  std::ofstream(d + "/index.json") << j.dump();
}

TEST(Checkpoint, ReadsFormatVersion1) {
  test::TempDir dir("bt_ckpt");
  const Globals saved(1);
  const std::string d = save(request(dir.file("ck"), 5, saved), nullptr);
  rewrite_as_version_1(d);
  ASSERT_EQ(read_index(d).tensors.at("param/a").pieces.at(0).block, 0);
  EXPECT_TRUE(verify(d).empty());
  const Globals got(2);
  load_pieces(d, read_index(d), {piece("param/a", got.a, 2, 15), piece("param/a", got.a, 0, 2)});
  EXPECT_EQ(values(got.a), values(saved.a));
  flip_a_data_byte(d + "/rank_00000.h5");
  EXPECT_FALSE(verify(d).empty()) << "Fletcher-32 or the crc32 must notice the flipped byte";
}

// Note [Partial reads of format 1]: the ranges of one read that fall in the
// same format-1 piece share one read of it, each range still getting its
// own elements; a later read reads the piece again.
TEST(Checkpoint, RangesOfOneFormat1PieceShareOneRead) {
  test::TempDir dir("bt_ckpt");
  const Globals saved(1);
  const std::string d = save(request(dir.file("ck"), 5, saved), nullptr);
  rewrite_as_version_1(d);
  const Index idx = read_index(d);
  const std::vector<SavedPiece>& pieces = idx.tensors.at("param/a").pieces;
  ASSERT_EQ(pieces.size(), 3u);
  const SavedPiece& mid = pieces[1];  // elements [4, 11)
  ASSERT_EQ(mid.begin, 4);
  ASSERT_EQ(mid.end, 11);
  ShardReader reader(d);
  std::vector<float> got(15, -1.0f);
  reader.read({{&mid, 4, 6, got.data() + 4},
               {&pieces[0], 1, 4, got.data() + 1},
               {&mid, 9, 11, got.data() + 9},
               {&mid, 6, 9, got.data() + 6}});
  EXPECT_EQ(reader.legacy_piece_reads(), 2) << "one read of each of the two pieces";
  const std::vector<float> want = values(saved.a);
  for (int64_t i = 1; i < 11; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], want[static_cast<size_t>(i)]) << i;
  EXPECT_EQ(got[0], -1.0f) << "element 0 was not asked for";
  reader.read({{&mid, 4, 11, got.data() + 4}});
  EXPECT_EQ(reader.legacy_piece_reads(), 3);
}

// Note [Partial reads of format 1]: a format-1 dataset holding other data
// than its piece (sound Fletcher-32 chunks, the wrong floats) is caught by a
// partial read as by a whole one; found by tests/fuzz/fuzz_ckpt_shard.cpp.
TEST(Checkpoint, APartialReadOfFormat1ChecksTheWholePiece) {
  test::TempDir dir("bt_ckpt");
  const Globals saved(1);
  const std::string d = save(request(dir.file("ck"), 5, saved), nullptr);
  rewrite_as_version_1(d);
  {
    const hid_t f = H5Fopen((d + "/rank_00000.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    const hid_t ds = H5Dopen2(f, "param/a/4", H5P_DEFAULT);
    const std::vector<float> other(7, 0.5f);
    ASSERT_GE(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, other.data()), 0);
    H5Dclose(ds);
    H5Fclose(f);
  }
  const Globals got(2);
  const std::string msg =
      test::error_message([&] { load_pieces(d, read_index(d), {piece("param/a", got.a, 5, 7)}); });
  EXPECT_NE(msg.find("dataset 'param/a/4' does not match its crc32"), std::string::npos) << msg;
  load_pieces(d, read_index(d), {piece("param/a", got.a, 1, 3)});  // another piece: sound
  EXPECT_EQ(values(got.a)[2], values(saved.a)[2]);
}

// Note [Only the file we were given] (checkpoint/h5_util.h): a rank file
// whose dataset is an external link to another file, or keeps its data in
// one, is refused even when that file holds the right floats.
TEST(Checkpoint, DataInAnotherFileIsRefused) {
  test::TempDir dir("bt_ckpt");
  const Globals saved(1);
  const std::string d = save(request(dir.file("ck"), 5, saved), nullptr);
  rewrite_as_version_1(d);  // HDF5 reads its data: the other file would be read
  const std::string file = d + "/rank_00000.h5", copy = dir.file("copy.h5");
  fs::copy_file(file, copy);
  std::vector<float> b = values(saved.b);
  const std::string raw = dir.file("b.bin");
  std::ofstream(raw, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), 28);
  {
    const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(H5Ldelete(f, "param/a/0", H5P_DEFAULT), 0);
    ASSERT_GE(H5Lcreate_external(copy.c_str(), "param/a/0", f, "param/a/0", H5P_DEFAULT, H5P_DEFAULT), 0);
    ASSERT_GE(H5Ldelete(f, "adam_m/b/0", H5P_DEFAULT), 0);
    const hsize_t dims[1] = {7};
    const hid_t space = H5Screate_simple(1, dims, nullptr), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_external(dcpl, raw.c_str(), 0, 28);
    H5Dclose(H5Dcreate2(f, "adam_m/b/0", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    H5Pclose(dcpl), H5Sclose(space), H5Fclose(f);
  }
  const Globals got(2);
  std::string msg =
      test::error_message([&] { load_pieces(d, read_index(d), {piece("param/a", got.a, 0, 2)}); });
  EXPECT_NE(msg.find("dataset 'param/a/0'"), std::string::npos) << msg;
  msg = test::error_message([&] { load_pieces(d, read_index(d), {piece("adam_m/b", got.b, 0, 7)}); });
  EXPECT_NE(msg.find("dataset 'adam_m/b/0' keeps its data in external files"), std::string::npos) << msg;
  EXPECT_EQ(verify(d).size(), 2u);
}

TEST(Checkpoint, ATensorOfAnotherShapeIsRefusedByName) {
  test::TempDir dir("bt_ckpt");
  const Globals g(1);
  const std::string d = save(request(dir.file("ck"), 1, g), nullptr);
  const Tensor wider = zeros({3, 6});
  std::string msg;
  try {
    load_pieces(d, read_index(d), {piece("param/a", wider, 0, 18)});
  } catch (const Incompatible& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("'param/a' has shape [3, 5] there but [3, 6]"), std::string::npos) << msg;
  try {
    msg.clear();
    load_pieces(d, read_index(d), {piece("param/c", wider, 0, 18)});
  } catch (const Incompatible& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("no tensor 'param/c'"), std::string::npos) << msg;
}

// A 1 MiB tmpfs: the first checkpoint fits, the second (2 MiB) does not. The
// failed save must throw naming the file and leave the first one and `latest`
// as they were (and no temporary directory).
TEST(Checkpoint, AFullDiskLeavesThePreviousCheckpoint) {
  test::TempDir dir("bt_ckpt");
  const std::string root = dir.file("small_disk");
  fs::create_directories(root);
  if (::mount("tmpfs", root.c_str(), "tmpfs", 0, "size=1m") != 0) {
    const std::string why = std::strerror(errno);
    // Where scripts/test could mount one (CI), a skip would hide the test.
    if (test::required("BT_REQUIRE_TMPFS"))
      FAIL() << "cannot mount a tmpfs here: " << why
             << " (BT_REQUIRE_TMPFS=1, which scripts/test sets where a probe mount of a tmpfs works)";
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): " << why;
  }
  struct Unmount {
    std::string p;
    ~Unmount() { ::umount(p.c_str()); }
  } unmount{root};
  const Globals g(1);
  save(request(root, 1, g), nullptr);
  Generator gen(5);
  const Tensor big = randn({1 << 19}, {}, &gen);  // 2 MiB
  SaveRequest r = request(root, 2, g);
  r.pieces.push_back(piece("param/big", big, 0, big.numel()));
  const std::string msg = test::error_message([&] { save(r, nullptr); });
  EXPECT_NE(msg.find("step_00000002.tmp/rank_00000.h5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the disk is full"), std::string::npos) << msg;
  EXPECT_EQ(fs::path(latest(root)).filename(), "step_00000001");
  EXPECT_EQ(list(root).size(), 1u);
  EXPECT_FALSE(fs::exists(root + "/step_00000002.tmp"));
  EXPECT_TRUE(verify(latest(root)).empty());
}

TEST(Checkpoint, H5lsListsEveryPiece) {
  if (test::run_command("command -v h5ls >/dev/null").status != 0) {
    if (test::data_required()) FAIL() << "h5ls missing and BT_REQUIRE_DATA=1";
    GTEST_SKIP() << "h5ls not installed (hdf5-tools)";
  }
  test::TempDir dir("bt_ckpt");
  const Globals g(1);
  const std::string d = save(request(dir.file("ck"), 1, g), nullptr);
  const test::CommandResult r = test::run_command("h5ls -r " + test::shell_quote(d + "/rank_00000.h5"));
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* ds : {"/param/a/0 ", "/param/a/4 ", "/param/a/11 ", "/adam_m/b/0 "})
    EXPECT_NE(r.out.find(ds), std::string::npos) << ds << " in\n" << r.out;
  // The checksums of the index are in the file too, for readers without it.
  const Index idx = read_index(d);
  const SavedPiece& p = idx.tensors.at("param/a").pieces.at(1);
  const test::CommandResult a = test::run_command("h5dump -a /param/a/4/crc32 -a /param/a/4/block_crc32 " +
                                                  test::shell_quote(d + "/rank_00000.h5"));
  ASSERT_EQ(a.status, 0) << a.out;
  EXPECT_NE(a.out.find(cat("(0): ", p.crc32)), std::string::npos) << a.out;
  EXPECT_EQ(p.block_crc32.size(), 1u);
  EXPECT_EQ(p.block_crc32[0], p.crc32);
}

}  // namespace
}  // namespace bt::ckpt
