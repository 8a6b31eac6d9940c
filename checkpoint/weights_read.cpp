#include "checkpoint/weights_read.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>

#include <hdf5.h>

#include "checkpoint/h5_check.h"
#include "checkpoint/h5_util.h"

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

std::string printable_dims(const std::vector<hsize_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

herr_t collect_attr_name(hid_t, const char* name, const H5A_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->emplace_back(name);
  return 0;
}

/// Integer attribute `name`'s value. HDF5 would clamp one an int64_t cannot
/// hold (an unsigned 2^64 - 1 would read as 2^63 - 1), so those are refused.
int64_t read_int(hid_t attr, hid_t type, const std::string& where, const std::string& name) {
  const bool is_signed = BT_H5_CHECK(H5Tget_sign(type)) == H5T_SGN_2;
  BT_CHECK(H5Tget_size(type) <= 8, where, ": attribute '", name, "' is an integer wider than 64 bits");
  if (is_signed) {
    int64_t v = 0;
    BT_H5_CHECK(H5Aread(attr, H5T_NATIVE_INT64, &v));
    return v;
  }
  uint64_t u = 0;
  BT_H5_CHECK(H5Aread(attr, H5T_NATIVE_UINT64, &u));
  BT_CHECK(u <= uint64_t{INT64_MAX}, where, ": attribute '", name, "' is ", u,
           ", more than a 64-bit signed integer holds");
  return static_cast<int64_t>(u);
}

/// The root attributes into `out`; checks `format` and `version`.
void read_attrs(hid_t file, const std::string& where, WeightFileInfo& out) {
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
    const int64_t v = read_int(attr, type, where, name);
    if (name == "version") {
      version = v;
      has_version = true;
    } else {
      out.attrs[name] = v;
    }
  }
  BT_CHECK(has_format, where,
           " has no 'format' attribute: it is not a BluTrain weights file (expected format '", kWeightsFormat,
           "')");
  BT_CHECK(format == kWeightsFormat, where, " has format '", format, "', expected '", kWeightsFormat, "'");
  BT_CHECK(has_version, where, " has no 'version' attribute");
  BT_CHECK(version >= 1 && version <= kWeightsVersion, where, " has version ", version,
           ", but this BluTrain reads version ", kWeightsVersion, " of '", kWeightsFormat, "'");
}

// Note [Only data the file holds]: a dataset's shape is only a claim. A
// hostile or damaged file can declare [2^40, 2^40] floats (an element count
// that overflows int64_t) or a dataset whose data was never written (HDF5
// would read its fill value), in a file of a few kilobytes. So before asking
// for a buffer, the reader checks that the element count (zero dims counted
// as one, as strides are) fits an int64_t in bytes, and that the data is
// stored in the file: a contiguous or compact dataset has all of its bytes
// there, a chunked one all of its chunks (compressed ones included), and no
// data lies in another file (Note [Only the file we were given]). A buffer is
// thus never larger than the file's data, or its decompressed chunks.

/// The shape of dataset `obj` (`space` its dataspace), checked to be one a
/// tensor can have, and its data to be stored in the file
/// (Note [Only data the file holds]).
Shape stored_shape(hid_t obj, hid_t space, const std::string& what) {
  Shape shape;
  if (H5Sget_simple_extent_type(space) == H5S_SIMPLE) {
    const int rank = BT_H5_CHECK(H5Sget_simple_extent_ndims(space));
    std::vector<hsize_t> dims(static_cast<size_t>(rank));
    BT_H5_CHECK(H5Sget_simple_extent_dims(space, dims.data(), nullptr));
    int64_t span = 1;
    for (const hsize_t d : dims) {
      BT_CHECK(d <= static_cast<hsize_t>(INT64_MAX / 4) &&
                   !__builtin_mul_overflow(span, std::max<int64_t>(static_cast<int64_t>(d), 1), &span) &&
                   span <= INT64_MAX / 4,
               what, " has dims ", printable_dims(dims), ": more elements than a tensor can hold");
      shape.push_back(static_cast<int64_t>(d));
    }
  }
  const int64_t numel = shape_numel(shape);
  if (numel == 0) return shape;
  h5::Id dcpl(BT_H5_CHECK(H5Dget_create_plist(obj)), H5Pclose);
  h5::check_data_in_file(dcpl, what);
  if (H5Pget_layout(dcpl) == H5D_CHUNKED) {
    const int rank = BT_H5_CHECK(H5Pget_chunk(dcpl, 0, nullptr));
    std::vector<hsize_t> chunk(static_cast<size_t>(rank));
    BT_H5_CHECK(H5Pget_chunk(dcpl, rank, chunk.data()));
    BT_CHECK(chunk.size() == shape.size(), what, " has chunks of another rank than its shape");
    hsize_t want = 1, have = 0;  // chunks; no overflow: want <= numel
    for (size_t i = 0; i < chunk.size(); ++i) {
      BT_CHECK(chunk[i] > 0, what, " has an empty chunk");
      want *= (static_cast<hsize_t>(shape[i]) + chunk[i] - 1) / chunk[i];
    }
    BT_H5_CHECK(H5Dget_num_chunks(obj, space, &have));
    BT_CHECK(have == want, what, " stores ", have, " of its ", want,
             " chunks: its data is missing (the file is corrupt or truncated)");
  } else {
    const hsize_t have = H5Dget_storage_size(obj), want = static_cast<hsize_t>(numel) * 4;
    BT_CHECK(have >= want, what, " stores ", have, " of the ", want,
             " bytes its shape needs: its data is missing (the file is corrupt or truncated)");
  }
  return shape;
}

/// The root object `name`, a float32 dataset: its shape into `entry`, its data
/// into the buffer `into` gives.
void read_tensor(hid_t file, const std::string& name, const std::string& where,
                 const std::function<float*(const WeightEntry&)>& into, WeightEntry& entry) {
  entry.name = name;
  H5L_info_t link;
  BT_H5_CHECK(H5Lget_info(file, name.c_str(), &link, H5P_DEFAULT));
  BT_CHECK(link.type != H5L_TYPE_EXTERNAL, where, ": root object '", name,
           "' is an external link to another file (weights files hold only their own datasets)");
  // Note [Each tensor under one name]: a second name for a dataset -- a soft
  // link, or a hard one -- would load one tensor's data into another
  // parameter (an alias named like a real tensor) where the names decide.
  if (link.type == H5L_TYPE_SOFT) {
    std::string target(link.u.val_size, '\0');
    BT_H5_CHECK(H5Lget_val(file, name.c_str(), target.data(), target.size(), H5P_DEFAULT));
    target.resize(std::strlen(target.c_str()));
    BT_FAIL(where, ": root object '", name, "' is a soft link to '", target,
            "' (weights files hold each tensor once, as a dataset under its own name)");
  }
  const h5::Id lapl = h5::local_access(H5P_LINK_ACCESS);
  h5::Id obj(BT_H5_CHECK(H5Oopen(file, name.c_str(), lapl)), H5Oclose);
  BT_CHECK(H5Iget_type(obj) == H5I_DATASET, where, ": root object '", name,
           "' is not a dataset (weights files hold only datasets in the root group)");
#if H5_VERSION_GE(1, 12, 0)
  H5O_info2_t info;
  BT_H5_CHECK(H5Oget_info3(obj, &info, H5O_INFO_BASIC));
#else
  H5O_info_t info;
  BT_H5_CHECK(H5Oget_info2(obj, &info, H5O_INFO_BASIC));
#endif
  BT_CHECK(info.rc == 1, where, ": tensor '", name, "' is stored under ", info.rc,
           " names (hard links; weights files hold each tensor once, under its own name)");
  h5::Id type(BT_H5_CHECK(H5Dget_type(obj)), H5Tclose);
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  BT_CHECK(cls == H5T_FLOAT && size == 4, where, ": tensor '", name, "' is a ", 8 * size, "-bit ",
           class_name(cls), " dataset, expected float32");
  h5::Id space(BT_H5_CHECK(H5Dget_space(obj)), H5Sclose);
  const H5S_class_t sc = H5Sget_simple_extent_type(space);
  BT_CHECK(sc == H5S_SCALAR || sc == H5S_SIMPLE, where, ": tensor '", name,
           "' has an empty (null) dataspace");
  entry.shape = stored_shape(obj, space, cat(where, ": tensor '", name, "'"));
  float* data = into(entry);
  if (shape_numel(entry.shape) > 0)
    BT_H5_CHECK(H5Dread(obj, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
}

}  // namespace

WeightFileInfo read_weight_file(const std::string& path,
                                const std::function<float*(const WeightEntry&)>& into) {
  detail::h5_silence_auto_errors();
  std::error_code ec;
  BT_CHECK(fs::exists(path, ec), "weights file '", path, "' does not exist");
  BT_CHECK(fs::is_regular_file(path, ec), "weights file '", path, "' is not a regular file");
  const htri_t is_h5 = H5Fis_hdf5(path.c_str());
  H5Eclear2(H5E_DEFAULT);
  BT_CHECK(is_h5 > 0, "weights file '", path, "' is not an HDF5 file (no HDF5 signature): it is corrupt, ",
           "or not a weights file");

  WeightFileInfo out;
  out.path = path;
  const std::string where = cat("weights file '", path, "'");
  h5::Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  BT_CHECK(file.get() >= 0, "cannot open ", where, ": ", h5::error_stack(),
           " (the file is truncated or corrupt)");

  h5::with_context(cat("cannot read ", where, " (it may be corrupt)"), [&] {
    read_attrs(file, where, out);
    // The datasets, in creation order when the file tracks it.
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
      read_tensor(file, name, where, into, out.tensors.emplace_back());
    }
  });
  return out;
}

void check_weight_attrs(const std::string& path, const std::map<std::string, int64_t>& attrs,
                        const std::map<std::string, int64_t>& expected) {
  for (const auto& [key, want] : expected) {
    const auto it = attrs.find(key);
    BT_CHECK(it != attrs.end(), "weights file '", path, "' has no attribute '", key, "' (expected ", key,
             " = ", want, ")");
    BT_CHECK(it->second == want, "weights file '", path, "' has ", key, " = ", it->second,
             ", but the model has ", key, " = ", want, "; it was saved from a different model configuration");
  }
}

std::vector<size_t> match_weights(const std::string& path, const std::vector<WeightEntry>& file,
                                  const std::vector<WeightEntry>& wanted) {
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < file.size(); ++i) by_name[file[i].name] = i;
  std::set<std::string> names;
  std::vector<size_t> out;
  for (const WeightEntry& p : wanted) {
    BT_CHECK(names.insert(p.name).second, "load_into: parameter '", p.name, "' is given twice");
    const auto it = by_name.find(p.name);
    BT_CHECK(it != by_name.end(), "weights file '", path, "' has no tensor '", p.name,
             "', which the model needs (", file.size(), " tensors in the file, ", wanted.size(),
             " parameters in the model)");
    const WeightEntry& t = file[it->second];
    BT_CHECK(t.shape == p.shape, "weights file '", path, "': tensor '", p.name, "' has shape ",
             shape_str(t.shape), " but the model's parameter has shape ", shape_str(p.shape));
    out.push_back(it->second);
  }
  for (const WeightEntry& t : file)
    BT_CHECK(names.count(t.name), "weights file '", path, "' has a tensor '", t.name, "' (shape ",
             shape_str(t.shape), ") that the model does not have; it was saved from a different model");
  return out;
}

}  // namespace bt
