#include "checkpoint/weights.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>

#include <fcntl.h>
#include <unistd.h>

#include "checkpoint/h5_check.h"
#include "checkpoint/h5_util.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/tensor/factory.h"
#include "runtime/tensor/shape.h"

namespace bt {
namespace {

namespace fs = std::filesystem;

void write_file(const std::string& tmp, const std::vector<std::pair<std::string, Tensor>>& named,
                const std::map<std::string, int64_t>& attrs, const std::map<std::string, std::string>& text) {
  h5::Id fcpl(BT_H5_CHECK(H5Pcreate(H5P_FILE_CREATE)), H5Pclose);
  BT_H5_CHECK(H5Pset_link_creation_order(fcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED));
  h5::Id file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, fcpl, H5P_DEFAULT), H5Fclose);
  BT_CHECK(file.get() >= 0, "cannot create the temporary weights file '", tmp, "': ", h5::error_stack());

  h5::write_string_attr(file, "format", kWeightsFormat);
  h5::write_int_attr(file, "version", kWeightsVersion);
  for (const auto& [key, value] : attrs) h5::write_int_attr(file, key, value);
  for (const auto& [key, value] : text) h5::write_string_attr(file, key, value);

  NoGradGuard no_grad;
  for (const auto& [name, t] : named) {
    const Tensor host = t.detach().to(Device::cpu()).to(DType::F32).contiguous();
    std::vector<hsize_t> dims(host.shape().begin(), host.shape().end());
    h5::Id space(dims.empty()
                     ? BT_H5_CHECK(H5Screate(H5S_SCALAR))
                     : BT_H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)),
                 H5Sclose);
    h5::Id dset(BT_H5_CHECK(H5Dcreate2(file, name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT,
                                       H5P_DEFAULT)),
                H5Dclose);
    if (host.numel() > 0)
      BT_H5_CHECK(H5Dwrite(dset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, host.data<float>()));
  }
  BT_H5_CHECK(H5Fclose(file.release()));  // a failed flush on close must fail the save
}

}  // namespace

const Tensor* WeightFile::find(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

void save_weights(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& named,
                  const std::map<std::string, int64_t>& attrs,
                  const std::map<std::string, std::string>& text) {
  detail::h5_silence_auto_errors();
  std::set<std::string> seen;
  for (const auto& [name, t] : named) {
    BT_CHECK(!name.empty(), "save_weights('", path, "'): a tensor has an empty name");
    BT_CHECK(name.find('/') == std::string::npos && name != ".", "save_weights('", path, "'): tensor name '",
             name, "' contains '/' or is '.'; names are flat dataset names in the root group");
    BT_CHECK(seen.insert(name).second, "save_weights('", path, "'): tensor '", name, "' is given twice");
    BT_CHECK(t.defined(), "save_weights('", path, "'): tensor '", name, "' is undefined");
    BT_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::BF16, "save_weights('", path, "'): tensor '",
             name, "' has dtype ", t.dtype(), "; only f32 and bf16 tensors are saved (as f32)");
  }
  for (const auto& [key, value] : attrs) {
    BT_CHECK(!key.empty(), "save_weights('", path, "'): an attribute has an empty name");
    BT_CHECK(key != "format" && key != "version", "save_weights('", path, "'): attribute '", key,
             "' is reserved; save_weights writes it itself");
  }
  for (const auto& [key, value] : text) {
    BT_CHECK(!key.empty() && key != "format" && key != "version" && attrs.count(key) == 0, "save_weights('",
             path, "'): text attribute '", key, "' is empty, reserved or also an integer attribute");
  }

  std::error_code ec;
  fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) parent = ".";
  BT_CHECK(fs::is_directory(parent, ec), "cannot save weights to '", path, "': directory '", parent.string(),
           "' does not exist; create it first");
  BT_CHECK(!fs::is_directory(path, ec), "cannot save weights to '", path, "': it is a directory");

  const std::string tmp = path + ".tmp";
  bool tmp_created = false;
  try {
    h5::with_context(cat("cannot write weights file '", path, "' (via '", tmp, "')"), [&] {
      BT_CHECK(!fs::is_directory(tmp, ec), "cannot write weights file '", path, "': its temporary path '",
               tmp, "' is a directory; remove it");
      tmp_created = true;  // H5Fcreate may create (or truncate) it from here on
      write_file(tmp, named, attrs, text);
    });
    h5::fsync_path(tmp, false);
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      BT_FAIL("cannot rename '", tmp, "' to weights file '", path, "': ", std::strerror(errno));
  } catch (...) {
    if (tmp_created && fs::is_regular_file(tmp, ec)) fs::remove(tmp, ec);
    throw;
  }
  h5::fsync_path(parent.string(), true);
}

WeightFile load_weights(const std::string& path) {
  std::vector<Tensor> made;
  WeightFileInfo info = read_weight_file(path, [&](const WeightEntry& e) {
    made.push_back(empty(e.shape, TensorOptions{DType::F32, Device::cpu()}));
    return made.back().data<float>();
  });
  WeightFile out;
  out.path = std::move(info.path);
  out.attrs = std::move(info.attrs);
  out.text_attrs = std::move(info.text_attrs);
  for (size_t i = 0; i < made.size(); ++i) out.tensors.emplace_back(std::move(info.tensors[i].name), made[i]);
  return out;
}

void check_weight_attrs(const WeightFile& file, const std::map<std::string, int64_t>& expected) {
  check_weight_attrs(file.path, file.attrs, expected);
}

void load_into(const WeightFile& file, const std::vector<std::pair<std::string, Tensor>>& params) {
  std::vector<WeightEntry> have, wanted;
  for (const auto& [name, t] : file.tensors) have.push_back({name, t.shape()});
  for (const auto& [name, p] : params) {
    BT_CHECK(p.defined(), "load_into: parameter '", name, "' is undefined");
    BT_CHECK(is_floating(p.dtype()), "load_into: parameter '", name, "' has dtype ", p.dtype(),
             ", not a floating dtype");
    wanted.push_back({name, p.shape()});
  }
  const std::vector<size_t> from = match_weights(file.path, have, wanted);

  NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor dst = params[i].second;  // a handle; copy_ writes through to the parameter's storage
    dst.copy_(file.tensors[from[i]].second);
  }
}

}  // namespace bt
