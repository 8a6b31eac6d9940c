// Weight-exchange files (checkpoint/weights.h): bitwise round trips, the error
// for each kind of bad file or mismatch, atomic saves, and that HDF5's own tools
// (h5ls, h5dump) and h5py read what save_weights writes.
#include <array>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <sys/resource.h>

#include "checkpoint/h5_check.h"
#include "checkpoint/weights.h"
#include "runtime/tensor/factory.h"
#include "tests/support/error_message.h"
#include "tests/support/fetched_data.h"
#include "tests/support/temp_dir.h"

namespace bt {
namespace {

namespace fs = std::filesystem;
using Named = std::vector<std::pair<std::string, Tensor>>;

bool require_tools() { return test::data_required(); }

/// Runs a shell command; returns its exit status and fills `out` with stdout.
int run(const std::string& cmd, std::string& out) {
  out.clear();
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return -1;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int st = ::pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

bool have_command(const std::string& name) {
  std::string out;
  return run("command -v " + name + " >/dev/null 2>&1", out) == 0;
}

/// GPT-2-named parameters for a 2-layer model with C=8, T=16, V=32 (padded 128).
Named gpt_like(uint64_t seed) {
  const int64_t C = 8, T = 16, Vp = 128, L = 2;
  Generator g(seed);
  Named out;
  auto add = [&](const std::string& name, const Shape& shape) {
    out.emplace_back(name, randn(shape, {}, &g));
  };
  add("wte", {Vp, C});
  add("wpe", {T, C});
  for (int64_t l = 0; l < L; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    add(h + "ln_1.weight", {C});
    add(h + "ln_1.bias", {C});
    add(h + "attn.c_attn.weight", {3 * C, C});
    add(h + "attn.c_attn.bias", {3 * C});
    add(h + "attn.c_proj.weight", {C, C});
    add(h + "attn.c_proj.bias", {C});
    add(h + "ln_2.weight", {C});
    add(h + "ln_2.bias", {C});
    add(h + "mlp.c_fc.weight", {4 * C, C});
    add(h + "mlp.c_fc.bias", {4 * C});
    add(h + "mlp.c_proj.weight", {C, 4 * C});
    add(h + "mlp.c_proj.bias", {C});
  }
  add("ln_f.weight", {C});
  add("ln_f.bias", {C});
  return out;
}

const std::map<std::string, int64_t> kAttrs = {{"n_layer", 2},  {"n_head", 2},      {"n_embd", 8},
                                               {"seq_len", 16}, {"vocab_size", 32}, {"padded_vocab", 128}};

Named zeros_like_all(const Named& named) {
  Named out;
  for (const auto& [n, t] : named) out.emplace_back(n, zeros(t.shape()));
  return out;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << "message: " << (msg)

/// Writes an HDF5 file by hand (no creation-order tracking), for formats that
/// save_weights refuses to produce.
struct RawFile {
  explicit RawFile(const std::string& path) {
    detail::h5_silence_auto_errors();
    id = BT_H5_CHECK(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  }
  ~RawFile() { H5Fclose(id); }
  /// A fixed-length (not variable-length) string attribute.
  void string_attr(const std::string& name, const std::string& value, H5T_str_t pad = H5T_STR_NULLPAD) {
    hid_t type = BT_H5_CHECK(H5Tcopy(H5T_C_S1));
    BT_H5_CHECK(H5Tset_size(type, value.size()));
    BT_H5_CHECK(H5Tset_strpad(type, pad));
    hid_t space = BT_H5_CHECK(H5Screate(H5S_SCALAR));
    hid_t a = BT_H5_CHECK(H5Acreate2(id, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT));
    BT_H5_CHECK(H5Awrite(a, type, value.data()));
    H5Aclose(a), H5Sclose(space), H5Tclose(type);
  }
  template <typename T>
  void scalar_attr(const std::string& name, hid_t file_type, hid_t mem_type, T v) {
    hid_t space = BT_H5_CHECK(H5Screate(H5S_SCALAR));
    hid_t a = BT_H5_CHECK(H5Acreate2(id, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT));
    BT_H5_CHECK(H5Awrite(a, mem_type, &v));
    H5Aclose(a), H5Sclose(space);
  }
  void header(const std::string& format = kWeightsFormat, int64_t version = kWeightsVersion) {
    string_attr("format", format);
    scalar_attr("version", H5T_STD_I32LE, H5T_NATIVE_INT64, version);  // any integer type is accepted
  }
  template <typename T>
  void dataset(const std::string& name, const std::vector<hsize_t>& dims, hid_t file_type, hid_t mem_type,
               const std::vector<T>& values) {
    hid_t space = BT_H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
    hid_t d =
        BT_H5_CHECK(H5Dcreate2(id, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    BT_H5_CHECK(H5Dwrite(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()));
    H5Dclose(d), H5Sclose(space);
  }
  hid_t id;
};

// A fixed-length string attribute reads back as written: trailing spaces are
// dropped only where the type says they pad (H5T_STR_SPACEPAD).
TEST(Weights, FixedStringAttributesKeepTheirTrailingSpacesUnlessSpacePadded) {
  test::TempDir dir("bt_weights");
  const std::string path = dir.file("strings.h5");
  {
    RawFile r(path);
    r.header();
    r.string_attr("nullpad", "two  ", H5T_STR_NULLPAD);
    r.string_attr("spacepad", "padded   ", H5T_STR_SPACEPAD);
    r.dataset<float>("x", {1}, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {1.0f});
  }
  const WeightFile f = load_weights(path);
  EXPECT_EQ(f.text_attrs.at("nullpad"), "two  ");
  EXPECT_EQ(f.text_attrs.at("spacepad"), "padded");
}

TEST(Weights, RoundTripIsBitwiseWithAttrsAndOrder) {
  test::TempDir dir("bt_weights");
  const std::string path = dir.file("w.h5");
  Named named = gpt_like(1);
  // Odd shapes: a scalar, a 3-d tensor, and values that test the bit patterns.
  named.emplace_back("scalar", from_vector<float>({-0.0f}, {}));
  named.emplace_back("cube",
                     from_vector<float>({1e-38f, -3.4e38f, 1.0f / 3.0f, 0.1f, 7.0f, -2.5f}, {1, 2, 3}));
  save_weights(path, named, kAttrs);
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  const WeightFile f = load_weights(path);
  EXPECT_EQ(f.path, path);
  EXPECT_EQ(f.attrs, kAttrs);
  ASSERT_EQ(f.tensors.size(), named.size());
  for (size_t i = 0; i < named.size(); ++i) {
    EXPECT_EQ(f.tensors[i].first, named[i].first) << "file order must be the order written";
    EXPECT_TRUE(f.tensors[i].second.device().is_cpu());
    EXPECT_EQ(f.tensors[i].second.dtype(), DType::F32);
    EXPECT_TRUE(bitwise_equal(f.tensors[i].second, named[i].second)) << named[i].first;
  }
  ASSERT_NE(f.find("h.1.mlp.c_proj.weight"), nullptr);
  EXPECT_EQ(f.find("h.1.mlp.c_proj.weight")->shape(), (Shape{8, 32}));
  EXPECT_EQ(f.find("nope"), nullptr);

  Named params = zeros_like_all(named);
  load_into(f, params);
  for (size_t i = 0; i < named.size(); ++i)
    EXPECT_TRUE(bitwise_equal(params[i].second, named[i].second)) << named[i].first;

  // Saving the loaded file again gives the same tensors (a second round trip).
  save_weights(path, f.tensors, f.attrs);
  const WeightFile g = load_weights(path);
  for (size_t i = 0; i < named.size(); ++i) EXPECT_TRUE(bitwise_equal(g.tensors[i].second, named[i].second));
}

TEST(Weights, SavesViewsAndBf16AsF32AndLoadsIntoRequiresGradParams) {
  test::TempDir dir("bt_weights");
  const std::string path = dir.file("w.h5");
  Generator g(3);
  Tensor big = randn({4, 6}, {}, &g);
  Tensor view = big.t();  // non-contiguous
  Tensor half = randn({5}, {}, &g).to(DType::BF16);
  save_weights(path, {{"view", view}, {"half", half}}, {});
  const WeightFile f = load_weights(path);
  EXPECT_TRUE(f.attrs.empty());
  EXPECT_TRUE(bitwise_equal(f.tensors[0].second, view.contiguous()));
  EXPECT_TRUE(bitwise_equal(f.tensors[1].second, half.to(DType::F32)));

  // Parameters that require grad, one bf16: load_into converts and writes in place.
  Tensor p0 = zeros({6, 4}).requires_grad_();
  Tensor p1 = zeros({5}, TensorOptions{DType::BF16}).requires_grad_();
  load_into(f, {{"view", p0}, {"half", p1}});
  EXPECT_TRUE(bitwise_equal(p0.detach(), view.contiguous()));
  EXPECT_TRUE(bitwise_equal(p1.detach(), half));
}

TEST(Weights, FileOrderIsNameOrderWithoutCreationOrderAndFixedStringsRead) {
  test::TempDir dir("bt_weights");
  const std::string path = dir.file("raw.h5");
  {
    RawFile r(path);
    r.header();
    r.scalar_attr("n_layer", H5T_STD_U8LE, H5T_NATIVE_INT64, int64_t{3});
    r.dataset<float>("b", {2}, H5T_IEEE_F32BE, H5T_NATIVE_FLOAT, {1.5f, -2.0f});  // big-endian converts
    r.dataset<float>("a", {1}, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {4.0f});
  }
  const WeightFile f = load_weights(path);
  EXPECT_EQ(f.attrs, (std::map<std::string, int64_t>{{"n_layer", 3}}));
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].first, "a");
  EXPECT_EQ(f.tensors[1].first, "b");
  EXPECT_EQ(f.tensors[1].second.to_vector<float>(), (std::vector<float>{1.5f, -2.0f}));
}

TEST(Weights, LoadIntoNamesTheMissingExtraOrMisshapenTensor) {
  test::TempDir dir("bt_weights");
  const std::string path = dir.file("w.h5");
  const Named named = gpt_like(2);
  save_weights(path, named, kAttrs);
  const WeightFile f = load_weights(path);

  // Missing: the model has a parameter the file lacks.
  Named more = zeros_like_all(named);
  more.emplace_back("h.2.ln_1.weight", zeros({8}));
  std::string m = test::error_message([&] { load_into(f, more); });
  EXPECT_HAS(m, "has no tensor 'h.2.ln_1.weight'");
  EXPECT_HAS(m, path);

  // Extra: the file has a tensor the model lacks.
  Named fewer = zeros_like_all(named);
  fewer.erase(fewer.begin() + 5);  // h.0.attn.c_attn.bias
  m = test::error_message([&] { load_into(f, fewer); });
  EXPECT_HAS(m, "'h.0.attn.c_attn.bias'");
  EXPECT_HAS(m, "does not have");

  // Shape mismatch: both shapes in the message; nothing is copied on failure.
  Named wrong = zeros_like_all(named);
  wrong[4].second = zeros({24, 4});  // h.0.attn.c_attn.weight is [24, 8]
  m = test::error_message([&] { load_into(f, wrong); });
  EXPECT_HAS(m, "'h.0.attn.c_attn.weight'");
  EXPECT_HAS(m, "[24, 8]");
  EXPECT_HAS(m, "[24, 4]");
  EXPECT_EQ(wrong[0].second.to_vector<float>(), std::vector<float>(128 * 8, 0.0f));
}

TEST(Weights, CheckWeightAttrsNamesTheMismatch) {
  test::TempDir dir("bt_weights");
  const std::string path = dir.file("w.h5");
  save_weights(path, gpt_like(2), kAttrs);
  const WeightFile f = load_weights(path);
  check_weight_attrs(f, kAttrs);
  check_weight_attrs(f, {{"n_layer", 2}});
  std::string m = test::error_message([&] { check_weight_attrs(f, {{"n_layer", 12}}); });
  EXPECT_HAS(m, "n_layer = 2");
  EXPECT_HAS(m, "n_layer = 12");
  m = test::error_message([&] { check_weight_attrs(f, {{"n_kv_head", 2}}); });
  EXPECT_HAS(m, "no attribute 'n_kv_head'");
}

TEST(Weights, MissingFileIsAClearError) {
  const std::string m = test::error_message([] { load_weights("/nonexistent/dir/w.h5"); });
  EXPECT_HAS(m, "'/nonexistent/dir/w.h5' does not exist");
}

TEST(Weights, GarbageFileIsNotHdf5) {
  test::TempDir dir("bt_weights");
  const std::string path = dir.file("garbage.h5");
  {
    std::ofstream o(path, std::ios::binary);
    for (int i = 0; i < 4096; ++i) o.put(static_cast<char>((i * 131 + 7) & 0xff));
  }
  const std::string m = test::error_message([&] { load_weights(path); });
  EXPECT_HAS(m, path);
  EXPECT_HAS(m, "not an HDF5 file");
  // An empty file too.
  std::ofstream(dir.file("empty.h5")).close();
  EXPECT_HAS(test::error_message([&] { load_weights(dir.file("empty.h5")); }), "not an HDF5 file");
}

TEST(Weights, TruncatedFileIsAClearError) {
  test::TempDir dir("bt_weights");
  const std::string path = dir.file("w.h5");
  save_weights(path, gpt_like(4), kAttrs);
  const auto size = fs::file_size(path);
  for (const auto keep : {size - 1, size / 2, uintmax_t{2048}}) {
    const std::string cut = dir.file("cut.h5");
    fs::copy_file(path, cut, fs::copy_options::overwrite_existing);
    fs::resize_file(cut, keep);
    const std::string m = test::error_message([&] { load_weights(cut); });
    EXPECT_HAS(m, cut);
    EXPECT_HAS(m, "truncated");
  }
}

TEST(Weights, WrongFormatOrVersionIsRefused) {
  test::TempDir dir("bt_weights");
  {
    RawFile r(dir.file("other.h5"));
    r.header("pytorch-state-dict");
  }
  std::string m = test::error_message([&] { load_weights(dir.file("other.h5")); });
  EXPECT_HAS(m, "format 'pytorch-state-dict'");
  EXPECT_HAS(m, "expected 'blutrain-weights'");
  {
    RawFile r(dir.file("none.h5"));
    r.dataset<float>("wte", {1}, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {1.0f});
  }
  EXPECT_HAS(test::error_message([&] { load_weights(dir.file("none.h5")); }), "no 'format' attribute");
  {
    RawFile r(dir.file("v2.h5"));
    r.header(kWeightsFormat, 2);
  }
  EXPECT_HAS(test::error_message([&] { load_weights(dir.file("v2.h5")); }), "has version 2");
  {
    RawFile r(dir.file("fattr.h5"));
    r.header();
    r.scalar_attr("n_layer", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 4.0);
  }
  m = test::error_message([&] { load_weights(dir.file("fattr.h5")); });
  EXPECT_HAS(m, "attribute 'n_layer' is a float");
}

TEST(Weights, NonFloat32DatasetsAndGroupsAreRefused) {
  test::TempDir dir("bt_weights");
  {
    RawFile r(dir.file("f64.h5"));
    r.header();
    r.dataset<double>("wte", {2}, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {1.0, 2.0});
  }
  std::string m = test::error_message([&] { load_weights(dir.file("f64.h5")); });
  EXPECT_HAS(m, "tensor 'wte' is a 64-bit float dataset, expected float32");
  {
    RawFile r(dir.file("group.h5"));
    r.header();
    H5Gclose(BT_H5_CHECK(H5Gcreate2(r.id, "h", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
  }
  m = test::error_message([&] { load_weights(dir.file("group.h5")); });
  EXPECT_HAS(m, "root object 'h' is not a dataset");
}

// Note [Only data the file holds] and Note [Only the file we were given]: a
// hostile file cannot make the reader allocate for data it does not hold,
// clamp an integer, or read another file (found by tests/fuzz/fuzz_weights.cpp).
TEST(Weights, HostileFilesAreRefusedBeforeAnyBufferIsMade) {
  test::TempDir dir("bt_weights");
  auto refused = [&](const std::string& file, const std::function<void(RawFile&)>& make) {
    {
      RawFile r(dir.file(file));
      r.header();
      make(r);
    }
    return test::error_message([&] { load_weights(dir.file(file)); });
  };
  auto unwritten = [](RawFile& r, std::vector<hsize_t> dims, bool chunked) {
    std::vector<hsize_t> max(dims.size(), H5S_UNLIMITED), chunk(dims.size(), 2);
    hid_t space = BT_H5_CHECK(
        H5Screate_simple(static_cast<int>(dims.size()), dims.data(), chunked ? max.data() : nullptr));
    hid_t dcpl = BT_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE));
    if (chunked) BT_H5_CHECK(H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()));
    H5Dclose(BT_H5_CHECK(H5Dcreate2(r.id, "wte", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT)));
    H5Pclose(dcpl), H5Sclose(space);
  };
  // [2^40, 2^40] floats in a file of a few kilobytes; [2^62, 4, 0] overflows int64 before the 0.
  EXPECT_HAS(refused("huge.h5",
                     [&](RawFile& r) {
                       unwritten(r, {hsize_t{1} << 40, hsize_t{1} << 40}, true);
                     }),
             "tensor 'wte' has dims [1099511627776, 1099511627776]: more elements than a tensor can hold");
  EXPECT_HAS(refused("over.h5",
                     [&](RawFile& r) {
                       unwritten(r, {hsize_t{1} << 62, 4, 0}, true);
                     }),
             "more elements than a tensor can hold");
  EXPECT_HAS(refused("chunks.h5",
                     [&](RawFile& r) {
                       unwritten(r, {4, 4}, true);
                     }),
             "tensor 'wte' stores 0 of its 4 chunks: its data is missing");
  EXPECT_HAS(refused("bytes.h5",
                     [&](RawFile& r) {
                       unwritten(r, {4, 4}, false);
                     }),
             "tensor 'wte' stores 0 of the 64 bytes its shape needs");
  // An unsigned 2^63 would read as 2^63 - 1.
  EXPECT_HAS(refused("u64.h5",
                     [](RawFile& r) {
                       r.scalar_attr("n_layer", H5T_STD_U64LE, H5T_NATIVE_UINT64, uint64_t{1} << 63);
                     }),
             "attribute 'n_layer' is 9223372036854775808, more than a 64-bit signed integer holds");
  // Data in another file, the same floats as a sound file would hold.
  const std::string other = dir.file("other.h5");
  {
    RawFile r(other);
    r.dataset<float>("x", {2}, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {1.0f, 2.0f});
  }
  EXPECT_HAS(
      refused("elink.h5",
              [&](RawFile& r) {
                BT_H5_CHECK(H5Lcreate_external(other.c_str(), "/x", r.id, "wte", H5P_DEFAULT, H5P_DEFAULT));
              }),
      "root object 'wte' is an external link to another file");
  EXPECT_HAS(
      refused("soft_to_elink.h5",
              [&](RawFile& r) {
                BT_H5_CHECK(H5Lcreate_external(other.c_str(), "/x", r.id, "a", H5P_DEFAULT, H5P_DEFAULT));
                BT_H5_CHECK(H5Lcreate_soft("/a", r.id, "b", H5P_DEFAULT, H5P_DEFAULT));
              }),
      "external link");
  // Note [Each tensor under one name]: another name for a dataset of the file.
  auto aliased = [](bool soft) {
    return [soft](RawFile& r) {
      r.dataset<float>("h.1.x", {2}, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {1.0f, 2.0f});
      BT_H5_CHECK(soft ? H5Lcreate_soft("/h.1.x", r.id, "h.0.x", H5P_DEFAULT, H5P_DEFAULT)
                       : H5Lcreate_hard(r.id, "h.1.x", r.id, "h.0.x", H5P_DEFAULT, H5P_DEFAULT));
    };
  };
  EXPECT_HAS(refused("soft_alias.h5", aliased(true)), "root object 'h.0.x' is a soft link to '/h.1.x'");
  EXPECT_HAS(refused("hard_alias.h5", aliased(false)), "is stored under 2 names (hard links");
  const std::string raw = dir.file("raw.bin");
  std::ofstream(raw, std::ios::binary).write("\0\0\x80\x3f\0\0\0\x40", 8);
  EXPECT_HAS(refused("external.h5",
                     [&](RawFile& r) {
                       const hsize_t dims[1] = {2};
                       hid_t space = BT_H5_CHECK(H5Screate_simple(1, dims, nullptr));
                       hid_t dcpl = BT_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE));
                       BT_H5_CHECK(H5Pset_external(dcpl, raw.c_str(), 0, 8));
                       H5Dclose(BT_H5_CHECK(
                           H5Dcreate2(r.id, "wte", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT)));
                       H5Pclose(dcpl), H5Sclose(space);
                     }),
             "tensor 'wte' keeps its data in external files");
  EXPECT_HAS(refused("virtual.h5",
                     [&](RawFile& r) {
                       const hsize_t dims[1] = {2};
                       hid_t space = BT_H5_CHECK(H5Screate_simple(1, dims, nullptr));
                       hid_t dcpl = BT_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE));
                       BT_H5_CHECK(H5Pset_virtual(dcpl, space, other.c_str(), "/x", space));
                       H5Dclose(BT_H5_CHECK(
                           H5Dcreate2(r.id, "wte", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT)));
                       H5Pclose(dcpl), H5Sclose(space);
                     }),
             "tensor 'wte' is a virtual dataset");
  // A tensor of no elements needs no data.
  {
    RawFile r(dir.file("fine.h5"));
    r.header();
    unwritten(r, {0, 3}, false);
    r.dataset<float>("c", {2}, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {1.0f, 2.0f});
  }
  const WeightFile f = load_weights(dir.file("fine.h5"));
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.find("wte")->shape(), (Shape{0, 3}));
}

TEST(Weights, SaveRefusesBadInputsAndMissingDirectory) {
  test::TempDir dir("bt_weights");
  const Tensor t = zeros({2});
  std::string m = test::error_message([&] { save_weights(dir.file("nodir/w.h5"), {{"a", t}}, {}); });
  EXPECT_HAS(m, "does not exist");
  EXPECT_HAS(m, "nodir");
  EXPECT_FALSE(fs::exists(dir.file("nodir")));
  EXPECT_HAS(test::error_message([&] {
               save_weights(dir.file("w.h5"), {{"a", t}, {"a", t}}, {});
             }),
             "'a' is given twice");
  EXPECT_HAS(test::error_message([&] { save_weights(dir.file("w.h5"), {{"h/0", t}}, {}); }), "contains '/'");
  EXPECT_HAS(test::error_message([&] { save_weights(dir.file("w.h5"), {{"", t}}, {}); }), "empty name");
  EXPECT_HAS(test::error_message([&] {
               save_weights(dir.file("w.h5"), {{"i", zeros({2}, {DType::I32})}}, {});
             }),
             "'i' has dtype");
  EXPECT_HAS(test::error_message([&] {
               save_weights(dir.file("w.h5"), {{"a", t}}, {{"version", 2}});
             }),
             "reserved");
  EXPECT_HAS(test::error_message([&] {
               save_weights(dir.path().string(), {{"a", t}}, {});
             }),
             "is a directory");
  EXPECT_FALSE(fs::exists(dir.file("w.h5")));
}

TEST(Weights, FailedSaveLeavesTheExistingFileIntact) {
  test::TempDir dir("bt_weights");
  const std::string path = dir.file("w.h5");
  const Named first = gpt_like(5);
  save_weights(path, first, kAttrs);
  const auto before = fs::file_size(path);

  // Make PATH.tmp impossible to create as a file.
  fs::create_directory(path + ".tmp");
  const std::string m = test::error_message([&] { save_weights(path, gpt_like(6), kAttrs); });
  EXPECT_HAS(m, path + ".tmp");
  EXPECT_TRUE(fs::is_directory(path + ".tmp")) << "a save must not delete what it did not create";
  EXPECT_EQ(fs::file_size(path), before);
  const WeightFile f = load_weights(path);
  for (size_t i = 0; i < first.size(); ++i) EXPECT_TRUE(bitwise_equal(f.tensors[i].second, first[i].second));

  // A stale regular PATH.tmp (from a crash) is simply replaced.
  fs::remove(path + ".tmp");
  std::ofstream(path + ".tmp") << "stale";
  const Named second = gpt_like(7);
  save_weights(path, second, kAttrs);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_TRUE(bitwise_equal(load_weights(path).tensors[0].second, second[0].second));
}

// A write that fails midway (file size limit: EFBIG) removes PATH.tmp and keeps PATH.
TEST(Weights, WriteFailureMidFileRemovesTheTemporaryAndKeepsTheOld) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  test::TempDir dir("bt_weights");
  const std::string path = dir.file("w.h5");
  const Named small = gpt_like(10);
  save_weights(path, small, kAttrs);
  Generator g(11);
  const Named big = {{"wte", randn({512, 1024}, {}, &g)}};  // 2 MiB of data
  // Runs in a child: a 256 KiB file size limit makes the 2 MiB write fail.
  auto child = [&] {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit lim{1 << 18, 1 << 18};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    try {
      save_weights(path, big, kAttrs);
    } catch (const Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      const WeightFile f = load_weights(path);
      const bool intact = !fs::exists(path + ".tmp") && f.tensors.size() == small.size() &&
                          bitwise_equal(f.tensors[0].second, small[0].second);
      std::_Exit(intact ? 0 : 3);
    }
    std::_Exit(2);
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(0), "cannot write weights file");
}

TEST(Weights, H5lsAndH5dumpListTheDatasets) {
  if (!have_command("h5ls") || !have_command("h5dump")) {
    if (require_tools()) FAIL() << "h5ls/h5dump missing and BT_REQUIRE_DATA=1";
    GTEST_SKIP() << "h5ls or h5dump not installed (hdf5-tools)";
  }
  test::TempDir dir("bt_weights");
  const std::string path = dir.file("w.h5");
  const Named named = gpt_like(8);
  save_weights(path, named, kAttrs);

  std::string out;
  ASSERT_EQ(run("h5ls '" + path + "'", out), 0) << out;
  for (const auto& [name, t] : named) {
    std::string dims;
    for (size_t i = 0; i < t.shape().size(); ++i) dims += (i ? ", " : "") + std::to_string(t.shape()[i]);
    // h5ls prints "NAME<spaces>Dataset {d0, d1}"
    const auto at = out.find(name + " ");
    ASSERT_NE(at, std::string::npos) << name << " not in:\n" << out;
    const auto line_end = out.find('\n', at);
    const std::string line = out.substr(at, line_end - at);
    EXPECT_HAS(line, "Dataset {" + dims + "}");
  }
  ASSERT_EQ(run("h5dump -H '" + path + "'", out), 0) << out;
  EXPECT_HAS(out, "DATASET \"h.1.attn.c_attn.weight\"");
  EXPECT_HAS(out, "H5T_IEEE_F32LE");
  EXPECT_HAS(out, "DATASPACE  SIMPLE { ( 24, 8 ) / ( 24, 8 ) }");
  EXPECT_HAS(out, "ATTRIBUTE \"format\"");
  EXPECT_HAS(out, "ATTRIBUTE \"padded_vocab\"");
  EXPECT_HAS(out, "H5T_STD_I64LE");
  ASSERT_EQ(run("h5dump -a /format '" + path + "'", out), 0) << out;
  EXPECT_HAS(out, "\"blutrain-weights\"");
}

/// h5py reads save_weights' files, and save_weights reads h5py's (the two sides
/// of the PyTorch fidelity test). Python: $BT_PYTHON, else python3.
TEST(Weights, H5pyReadsAndWritesTheFormat) {
  const char* env = std::getenv("BT_PYTHON");
  const std::string py = env && *env ? env : "python3";
  std::string out;
  if (run(py + " -c 'import h5py, numpy' 2>&1", out) != 0) {
    if (require_tools()) FAIL() << py << " cannot import h5py and numpy, and BT_REQUIRE_DATA=1: " << out;
    GTEST_SKIP() << py << " lacks h5py/numpy (set BT_PYTHON)";
  }
  test::TempDir dir("bt_weights");
  const std::string path = dir.file("w.h5");
  const Named named = gpt_like(9);
  save_weights(path, named, kAttrs);
  double sum = 0;
  for (const auto& [n, t] : named)
    for (float v : t.to_vector<float>()) sum += v;

  const std::string script = dir.file("check.py");
  std::ofstream(script) << R"PY(
import sys, h5py, numpy as np
src, dst = sys.argv[1], sys.argv[2]
with h5py.File(src, "r") as f:
    names = sorted(f.keys())  # h5py lists keys in name order
    assert f.attrs["format"] == "blutrain-weights", repr(f.attrs["format"])
    assert int(f.attrs["version"]) == 1
    attrs = {k: int(v) for k, v in f.attrs.items() if k not in ("format", "version")}
    total = sum(float(np.asarray(f[n], dtype=np.float64).sum()) for n in names)
    assert all(f[n].dtype == np.float32 for n in names)
    print("names", " ".join(names))
    print("shape", f["h.0.mlp.c_fc.weight"].shape)
    print("attrs", sorted(attrs.items()))
    print("sum %.9g" % total)
with h5py.File(dst, "w", track_order=True) as g:
    g.attrs["format"] = "blutrain-weights"
    g.attrs["version"] = np.int64(1)
    g.attrs["n_layer"] = np.int64(7)
    g.create_dataset("z.last", data=np.arange(6, dtype=np.float32).reshape(2, 3))
    g.create_dataset("a.first", data=np.array([0.25], dtype=np.float32))
)PY";
  const std::string back = dir.file("from_h5py.h5");
  ASSERT_EQ(run(py + " '" + script + "' '" + path + "' '" + back + "' 2>&1", out), 0) << out;
  std::set<std::string> sorted;
  for (const auto& [n, t] : named) sorted.insert(n);
  std::string names = "names";
  for (const auto& n : sorted) names += " " + n;
  EXPECT_HAS(out, names + "\n");
  EXPECT_HAS(out, "shape (32, 8)");
  EXPECT_HAS(out, "('n_layer', 2)");
  EXPECT_HAS(out, "('padded_vocab', 128)");
  const auto at = out.find("sum ");
  ASSERT_NE(at, std::string::npos) << out;
  EXPECT_NEAR(std::stod(out.substr(at + 4)), sum, 1e-6 * (1 + std::fabs(sum)));

  const WeightFile f = load_weights(back);
  EXPECT_EQ(f.attrs, (std::map<std::string, int64_t>{{"n_layer", 7}}));
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].first, "z.last") << "h5py track_order=True keeps the order written";
  EXPECT_EQ(f.tensors[0].second.shape(), (Shape{2, 3}));
  EXPECT_EQ(f.tensors[0].second.to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(f.tensors[1].first, "a.first");
}

}  // namespace
}  // namespace bt
