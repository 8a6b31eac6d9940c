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

const char* class_name(H5T_class_t c) {
  switch (c) {
    case H5T_INTEGER:
      return "integer";
    case H5T_FLOAT:
      return "float";
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ENUM:
      return "enum";
    case H5T_ARRAY:
      return "array";
    case H5T_VLEN:
      return "variable-length";
    default:
      return "non-numeric";
  }
}

herr_t collect_attr_name(hid_t, const char* name, const H5A_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->emplace_back(name);
  return 0;
}

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
  detail::h5_silence_auto_errors();
  std::error_code ec;
  BT_CHECK(fs::exists(path, ec), "weights file '", path, "' does not exist");
  BT_CHECK(fs::is_regular_file(path, ec), "weights file '", path, "' is not a regular file");
  const htri_t is_h5 = H5Fis_hdf5(path.c_str());
  H5Eclear2(H5E_DEFAULT);
  BT_CHECK(is_h5 > 0, "weights file '", path, "' is not an HDF5 file (no HDF5 signature): it is corrupt, ",
           "or not a weights file");

  WeightFile out;
  out.path = path;
  const std::string where = cat("weights file '", path, "'");
  h5::Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  BT_CHECK(file.get() >= 0, "cannot open ", where, ": ", h5::error_stack(),
           " (the file is truncated or corrupt)");

  h5::with_context(cat("cannot read ", where, " (it may be corrupt)"), [&] {
    // ---- attributes
    std::vector<std::string> names;
    hsize_t idx = 0;
    BT_H5_CHECK(H5Aiterate2(file, H5_INDEX_NAME, H5_ITER_INC, &idx, collect_attr_name, &names));
    std::string format;
    bool has_format = false, has_version = false;
    int64_t version = 0;
    for (const auto& name : names) {
      h5::Id attr(BT_H5_CHECK(H5Aopen(file, name.c_str(), H5P_DEFAULT)), H5Aclose);
      h5::Id type(BT_H5_CHECK(H5Aget_type(attr)), H5Tclose);
      h5::Id space(BT_H5_CHECK(H5Aget_space(attr)), H5Sclose);
      const H5T_class_t cls = H5Tget_class(type);
      const hssize_t npoints = BT_H5_CHECK(H5Sget_simple_extent_npoints(space));
      if (name == "format") {
        BT_CHECK(cls == H5T_STRING && npoints == 1, where, ": attribute 'format' is not a string");
        format = h5::read_string_attr(attr, type);
        has_format = true;
        continue;
      }
      if (cls == H5T_STRING && npoints == 1) {
        out.text_attrs[name] = h5::read_string_attr(attr, type);
        continue;
      }
      BT_CHECK(cls == H5T_INTEGER && npoints == 1, where, ": attribute '", name, "' is ",
               npoints == 1 ? "a " : "an array of ", class_name(cls), npoints == 1 ? "" : "s",
               ", but weights files hold only integer and string scalar attributes");
      int64_t v = 0;
      BT_H5_CHECK(H5Aread(attr, H5T_NATIVE_INT64, &v));
      if (name == "version") {
        version = v;
        has_version = true;
      } else {
        out.attrs[name] = v;
      }
    }
    BT_CHECK(has_format, where,
             " has no 'format' attribute: it is not a BluTrain weights file (expected format '",
             kWeightsFormat, "')");
    BT_CHECK(format == kWeightsFormat, where, " has format '", format, "', expected '", kWeightsFormat, "'");
    BT_CHECK(has_version, where, " has no 'version' attribute");
    BT_CHECK(version >= 1 && version <= kWeightsVersion, where, " has version ", version,
             ", but this BluTrain reads version ", kWeightsVersion, " of '", kWeightsFormat, "'");

    // ---- datasets, in creation order when the file tracks it
    h5::Id root(BT_H5_CHECK(H5Gopen2(file, "/", H5P_DEFAULT)), H5Gclose);
    h5::Id gcpl(BT_H5_CHECK(H5Gget_create_plist(root)), H5Pclose);
    unsigned order_flags = 0;
    BT_H5_CHECK(H5Pget_link_creation_order(gcpl, &order_flags));
    const H5_index_t index = (order_flags & H5P_CRT_ORDER_TRACKED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
    H5G_info_t ginfo;
    BT_H5_CHECK(H5Gget_info(file, &ginfo));
    for (hsize_t i = 0; i < ginfo.nlinks; ++i) {
      const ssize_t len =
          BT_H5_CHECK(H5Lget_name_by_idx(file, ".", index, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT));
      std::string name(static_cast<size_t>(len) + 1, '\0');
      BT_H5_CHECK(
          H5Lget_name_by_idx(file, ".", index, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT));
      name.resize(static_cast<size_t>(len));

      h5::Id obj(BT_H5_CHECK(H5Oopen(file, name.c_str(), H5P_DEFAULT)), H5Oclose);
      BT_CHECK(H5Iget_type(obj) == H5I_DATASET, where, ": root object '", name,
               "' is not a dataset (weights files hold only datasets in the root group)");
      h5::Id type(BT_H5_CHECK(H5Dget_type(obj)), H5Tclose);
      const H5T_class_t cls = H5Tget_class(type);
      const size_t size = H5Tget_size(type);
      BT_CHECK(cls == H5T_FLOAT && size == 4, where, ": tensor '", name, "' is a ", 8 * size, "-bit ",
               class_name(cls), " dataset, expected float32");
      h5::Id space(BT_H5_CHECK(H5Dget_space(obj)), H5Sclose);
      const H5S_class_t sc = H5Sget_simple_extent_type(space);
      BT_CHECK(sc == H5S_SCALAR || sc == H5S_SIMPLE, where, ": tensor '", name,
               "' has an empty (null) dataspace");
      Shape shape;
      if (sc == H5S_SIMPLE) {
        const int rank = BT_H5_CHECK(H5Sget_simple_extent_ndims(space));
        std::vector<hsize_t> dims(static_cast<size_t>(rank));
        BT_H5_CHECK(H5Sget_simple_extent_dims(space, dims.data(), nullptr));
        shape.assign(dims.begin(), dims.end());
      }
      Tensor t = empty(shape, TensorOptions{DType::F32, Device::cpu()});
      if (t.numel() > 0)
        BT_H5_CHECK(H5Dread(obj, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data<float>()));
      out.tensors.emplace_back(name, std::move(t));
    }
  });
  return out;
}

void check_weight_attrs(const WeightFile& file, const std::map<std::string, int64_t>& expected) {
  for (const auto& [key, want] : expected) {
    const auto it = file.attrs.find(key);
    BT_CHECK(it != file.attrs.end(), "weights file '", file.path, "' has no attribute '", key, "' (expected ",
             key, " = ", want, ")");
    BT_CHECK(it->second == want, "weights file '", file.path, "' has ", key, " = ", it->second,
             ", but the model has ", key, " = ", want, "; it was saved from a different model configuration");
  }
}

void load_into(const WeightFile& file, const std::vector<std::pair<std::string, Tensor>>& params) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : file.tensors) by_name[name] = &t;
  std::set<std::string> wanted;
  for (const auto& [name, p] : params) {
    BT_CHECK(wanted.insert(name).second, "load_into: parameter '", name, "' is given twice");
    BT_CHECK(p.defined(), "load_into: parameter '", name, "' is undefined");
    BT_CHECK(is_floating(p.dtype()), "load_into: parameter '", name, "' has dtype ", p.dtype(),
             ", not a floating dtype");
    const auto it = by_name.find(name);
    BT_CHECK(it != by_name.end(), "weights file '", file.path, "' has no tensor '", name,
             "', which the model needs (", file.tensors.size(), " tensors in the file, ", params.size(),
             " parameters in the model)");
    BT_CHECK(it->second->shape() == p.shape(), "weights file '", file.path, "': tensor '", name,
             "' has shape ", shape_str(it->second->shape()), " but the model's parameter has shape ",
             shape_str(p.shape()));
  }
  for (const auto& [name, t] : file.tensors)
    BT_CHECK(wanted.count(name), "weights file '", file.path, "' has a tensor '", name, "' (shape ",
             shape_str(t.shape()), ") that the model does not have; it was saved from a different model");

  NoGradGuard no_grad;
  for (const auto& [name, p] : params) {
    Tensor dst = p;  // a handle; copy_ writes through to the parameter's storage
    dst.copy_(*by_name.at(name));
  }
}

}  // namespace bt
