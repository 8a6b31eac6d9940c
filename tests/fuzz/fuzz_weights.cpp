// libFuzzer target: the weights file reader (checkpoint/weights_read.h: all
// that load_weights, check_weight_attrs and load_into check of a file) on
// hostile files. The input describes an HDF5 file (tests/fuzz/fuzz_h5.h):
// root attributes of many types and shapes, float32 datasets of any rank and
// shape (huge ones included) in every layout, with or without their data,
// datasets of other types, groups, named types, hard, soft and dangling
// links (a second name for anything makes the file one to refuse), and
// datasets whose data lies in another file. The target writes it
// with the HDF5 C API and reads it back. The reader must accept the file or
// throw bt::Error -- never crash, hang, leak, nor ask for a buffer for data
// the file does not hold. A file it accepts obeys the format (weights.h):
// `format` and `version` right, every other attribute an integer or string
// scalar that reads back as written; the tensors are exactly the root's
// links, in creation order (or name order), each a float32 dataset stored in
// this file whose shape and bytes read back as written; and match_weights
// of those names and shapes succeeds. A file built only of what the format
// allows is accepted.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <hdf5.h>

#include "checkpoint/h5_check.h"
#include "checkpoint/h5_util.h"
#include "checkpoint/weights_read.h"
#include "kernels/common/error.h"
#include "tests/fuzz/fuzz_file.h"
#include "tests/fuzz/fuzz_h5.h"

namespace bt::fuzz {
namespace {

constexpr int64_t kMaxWritten = 4096;  // elements of data the target writes, at most, per dataset

const std::vector<std::string> kNames = {"format",    "version", "wte",    "wpe",   "h.0.attn.c_attn.weight",
                                         "ln_f.bias", "n_layer", "n_embd", "model", "x"};
const std::vector<std::string> kTexts = {kWeightsFormat, "{\"arch\": \"gpt2\"}", "", "pytorch-state-dict",
                                         "blutrain-weights "};

/// An attribute as written: an integer, a string, or something the format refuses.
struct Attr {
  enum Kind { Int, Text, Bad } kind = Bad;
  int64_t value = 0;
  std::string text;
};

/// What a root link leads to.
struct Obj {
  enum Kind { F32, Unstored, OtherType, NotDataset, Dangling, Outside, Alias } kind = NotDataset;
  Shape shape;
  std::vector<float> data;
};

struct Expected {
  std::map<std::string, Attr> attrs;
  std::vector<std::pair<std::string, Obj>> links;  // creation order
  bool ok_names = true;
};

/// A link name the root can hold, or nullopt (the op is skipped).
std::optional<std::string> link_name(Bytes& in) {
  std::string n = in.choose(kNames);
  if (n.empty() || n == "." || n.find('/') != std::string::npos || n.find('\0') != std::string::npos)
    return std::nullopt;
  return n;
}

bool has_link(const Expected& e, const std::string& name) {
  return std::any_of(e.links.begin(), e.links.end(), [&](const auto& l) { return l.first == name; });
}

int64_t int_value(Bytes& in) {
  const uint8_t b = in.u8();
  return b < 0x80 ? b : static_cast<int64_t>(in.u64());
}

/// Op: a root attribute of one of many types.
void add_attr(hid_t file, Bytes& in, Expected& e) {
  std::string name = in.choose(kNames);
  if (name.empty() || name.find('\0') != std::string::npos || e.attrs.count(name)) return;
  const size_t kind = in.pick(12);
  Attr a;
  const int64_t v = int_value(in);
  std::string text = in.choose(kTexts);
  text.resize(std::strlen(text.c_str()));  // what a C string holds
  h5::Id scalar(BT_H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose);
  auto create = [&](hid_t type, hid_t space) {
    return H5Acreate2(file, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
  };
  herr_t rc = -1;
  if (kind <= 4) {  // integers of every width and sign
    const hid_t types[] = {H5T_STD_I64LE, H5T_STD_I32BE, H5T_STD_I8LE, H5T_STD_U64LE, H5T_STD_U32LE};
    const hid_t type = types[kind];
    h5::Id attr(create(type, scalar), H5Aclose);
    if (attr.get() < 0) return;
    const uint64_t u = static_cast<uint64_t>(v);  // as unsigned for the unsigned types
    rc = kind >= 3 ? H5Awrite(attr, H5T_NATIVE_UINT64, &u) : H5Awrite(attr, H5T_NATIVE_INT64, &v);
    int64_t stored = 0;
    if (rc >= 0) {  // the value the file holds, as its own type
      if (kind == 3) {
        uint64_t u = 0;
        rc = H5Aread(attr, H5T_NATIVE_UINT64, &u);
        a.kind = u <= uint64_t{INT64_MAX} ? Attr::Int : Attr::Bad;  // an int64 cannot hold it
        stored = static_cast<int64_t>(u);
      } else {
        rc = H5Aread(attr, H5T_NATIVE_INT64, &stored);
        a.kind = Attr::Int;
      }
    }
    a.value = stored;
  } else if (kind == 5) {  // a float
    const double d = static_cast<double>(v);
    h5::Id attr(create(H5T_IEEE_F64LE, scalar), H5Aclose);
    if (attr.get() < 0) return;
    rc = H5Awrite(attr, H5T_NATIVE_DOUBLE, &d);
  } else if (kind == 6) {  // a variable-length string, as h5py writes str
    try {
      h5::write_string_attr(file, name, text);
    } catch (const Error&) {
      return;
    }
    rc = 0;
    a = {Attr::Text, 0, text};
  } else if (kind == 7) {  // a fixed-length string, padded three ways
    const H5T_str_t pads[] = {H5T_STR_NULLTERM, H5T_STR_NULLPAD, H5T_STR_SPACEPAD};
    const uint64_t u = static_cast<uint64_t>(v);
    const H5T_str_t pad = pads[u % 3];
    std::string stored = text;  // trailing spaces are padding only when spaces pad
    if (pad == H5T_STR_SPACEPAD)
      while (!stored.empty() && stored.back() == ' ') stored.pop_back();
    h5::Id type(BT_H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
    const size_t size = stored.size() + (pad == H5T_STR_NULLTERM ? 1 : 0) + static_cast<size_t>(u % 4);
    if (size == 0) return;  // HDF5 has no strings of size 0
    BT_H5_CHECK(H5Tset_size(type, size));
    BT_H5_CHECK(H5Tset_strpad(type, pad));
    std::string buf(size, pad == H5T_STR_SPACEPAD ? ' ' : '\0');
    std::memcpy(buf.data(), stored.data(), stored.size());
    h5::Id attr(create(type, scalar), H5Aclose);
    if (attr.get() < 0) return;
    rc = H5Awrite(attr, type, buf.data());
    a = {Attr::Text, 0, stored};
  } else if (kind == 8) {  // an integer array of 0 to 3 elements: one element reads as a scalar
    const hsize_t dims[1] = {static_cast<uint64_t>(v) % 4};
    h5::Id space(BT_H5_CHECK(H5Screate_simple(1, dims, nullptr)), H5Sclose);
    h5::Id attr(create(H5T_STD_I64LE, space), H5Aclose);
    if (attr.get() < 0) return;
    const int64_t vals[3] = {v, v, v};
    rc = dims[0] > 0 ? H5Awrite(attr, H5T_NATIVE_INT64, vals) : 0;
    if (dims[0] == 1) a = {Attr::Int, v, ""};
  } else if (kind == 9) {  // an integer with a null dataspace
    h5::Id space(BT_H5_CHECK(H5Screate(H5S_NULL)), H5Sclose);
    h5::Id attr(create(H5T_STD_I64LE, space), H5Aclose);
    if (attr.get() < 0) return;
    rc = 0;
  } else if (kind == 10) {  // two strings
    const hsize_t dims[1] = {2};
    h5::Id space(BT_H5_CHECK(H5Screate_simple(1, dims, nullptr)), H5Sclose);
    h5::Id type(BT_H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
    BT_H5_CHECK(H5Tset_size(type, H5T_VARIABLE));
    h5::Id attr(create(type, space), H5Aclose);
    if (attr.get() < 0) return;
    const char* s[2] = {text.c_str(), text.c_str()};
    rc = H5Awrite(attr, type, s);
  } else {  // an enum, which is not an integer to the format
    h5::Id type(BT_H5_CHECK(H5Tenum_create(H5T_NATIVE_INT)), H5Tclose);
    const int zero = 0, one = 1;
    BT_H5_CHECK(H5Tenum_insert(type, "a", &zero));
    BT_H5_CHECK(H5Tenum_insert(type, "b", &one));
    h5::Id attr(create(type, scalar), H5Aclose);
    if (attr.get() < 0) return;
    rc = H5Awrite(attr, H5T_NATIVE_INT, &one);
  }
  if (rc < 0) throw Error("the target could not write an attribute");
  e.attrs[name] = a;
}

/// Op: a float32 dataset: rank 0-4 (or a null dataspace), any dims, any
/// layout and filter, its data written or not.
void add_f32(hid_t file, hid_t lcpl, Bytes& in, Expected& e) {
  const auto name = link_name(in);
  const uint8_t shape_byte = in.u8(), layout_byte = in.u8(), seed = in.u8();
  if (!name || has_link(e, *name)) return;
  const size_t rank = shape_byte % 6;  // 5: a null dataspace
  std::vector<hsize_t> dims;
  int64_t span = 1, numel = 1;  // span: the product of the dims, zeros counted as ones
  bool over = false;            // a shape no tensor can have
  for (size_t i = 0; i < std::min<size_t>(rank, 4); ++i) {
    const uint8_t b = in.u8();
    dims.push_back(b < 0xf0 ? b % 9 : (in.u64() >> (b & 7)));
    const uint64_t d = std::max<hsize_t>(dims.back(), 1);
    over = over || d > uint64_t{INT64_MAX} || __builtin_mul_overflow(span, static_cast<int64_t>(d), &span);
  }
  over = over || span > INT64_MAX / 4;
  if (!over)
    for (const hsize_t d : dims) numel *= static_cast<int64_t>(d);
  const bool huge = over || numel > kMaxWritten;
  const bool big_endian = layout_byte & 0x80, write = (layout_byte & 0x40) && !huge;
  size_t layout =
      layout_byte % 6;  // contiguous late, contiguous early, compact, chunked, + fletcher32, + deflate
  if (rank == 0 || rank == 5 || (huge && layout != 3)) layout = 0;
  h5::Id space(
      rank == 5 ? H5Screate(H5S_NULL)
      : rank == 0
          ? H5Screate(H5S_SCALAR)
          : H5Screate_simple(static_cast<int>(dims.size()), dims.data(),
                             layout >= 3 ? std::vector<hsize_t>(dims.size(), H5S_UNLIMITED).data() : nullptr),
      H5Sclose);
  if (space.get() < 0) return;
  h5::Id dcpl(BT_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
  if (layout == 1) BT_H5_CHECK(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY));
  if (layout == 2) BT_H5_CHECK(H5Pset_layout(dcpl, H5D_COMPACT));
  if (layout >= 3) {
    std::vector<hsize_t> chunk;
    for (size_t i = 0; i < dims.size(); ++i) chunk.push_back(1 + (seed >> (2 * i)) % 4);
    BT_H5_CHECK(H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()));
  }
  if (layout == 4) BT_H5_CHECK(H5Pset_fletcher32(dcpl));
  if (layout == 5) BT_H5_CHECK(H5Pset_shuffle(dcpl)), BT_H5_CHECK(H5Pset_deflate(dcpl, 1));
  h5::Id dset(H5Dcreate2(file, name->c_str(), big_endian ? H5T_IEEE_F32BE : H5T_IEEE_F32LE, space, lcpl, dcpl,
                         H5P_DEFAULT),
              H5Dclose);
  if (dset.get() < 0) return;
  Obj o;
  o.shape.assign(dims.begin(), dims.end());
  if (rank == 5) {
    o.kind = Obj::OtherType;  // a null dataspace holds no tensor
  } else if (over) {
    o.kind = Obj::Unstored;
  } else if (numel == 0) {
    o.kind = Obj::F32;
  } else if (write) {
    o.kind = Obj::F32;
    o.data = values(numel, seed);
    if (H5Dwrite(dset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, o.data.data()) < 0)
      throw Error("the target could not write a dataset");
  } else if (!huge && (layout == 1 || layout == 2)) {  // allocated at creation: zeros
    o.kind = Obj::F32;
    o.data.assign(static_cast<size_t>(numel), 0.0f);
  } else {
    o.kind = Obj::Unstored;
  }
  e.links.emplace_back(*name, std::move(o));
}

/// Op: a dataset of another type (never read: refused by its type).
void add_other(hid_t file, hid_t lcpl, Bytes& in, Expected& e) {
  const auto name = link_name(in);
  const size_t kind = in.pick(7);
  if (!name || has_link(e, *name)) return;
  h5::Id type(
      [&]() -> hid_t {
        const hsize_t adims[1] = {2};
        hid_t t = -1;
        switch (kind) {
          case 0:
            return H5Tcopy(H5T_IEEE_F64LE);
          case 1:
            return H5Tcopy(H5T_STD_I32LE);
          case 2:
            return H5Tcopy(H5T_STD_U8LE);
          case 3:
            t = H5Tcopy(H5T_C_S1), H5Tset_size(t, 4);
            return t;
          case 4:
            t = H5Tcreate(H5T_COMPOUND, 4), H5Tinsert(t, "f", 0, H5T_IEEE_F32LE);
            return t;
          case 5:
            return H5Tcreate(H5T_OPAQUE, 4);
          default:
            return H5Tarray_create2(H5T_IEEE_F32LE, 1, adims);
        }
      }(),
      H5Tclose);
  const hsize_t dims[1] = {3};
  h5::Id space(BT_H5_CHECK(H5Screate_simple(1, dims, nullptr)), H5Sclose);
  h5::Id dset(H5Dcreate2(file, name->c_str(), type, space, lcpl, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  if (dset.get() >= 0) e.links.push_back({*name, Obj{Obj::OtherType, {}, {}}});
}

/// Op: a group, a named datatype, a hard, soft or dangling link, or a
/// dataset whose data lies in another file.
void add_link(hid_t file, hid_t lcpl, Bytes& in, Expected& e) {
  const auto name = link_name(in);
  const size_t kind = in.pick(8), target = in.u8();
  if (!name || has_link(e, *name)) return;
  Obj o;
  bool made = false;
  if (kind == 0) {
    h5::Id g(H5Gcreate2(file, name->c_str(), lcpl, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    made = g.get() >= 0;
  } else if (kind == 1) {
    h5::Id t(BT_H5_CHECK(H5Tcopy(H5T_IEEE_F32LE)), H5Tclose);
    made = H5Tcommit2(file, name->c_str(), t, lcpl, H5P_DEFAULT, H5P_DEFAULT) >= 0;
  } else if (kind <= 3) {  // another name for an object already there: hard or soft
    if (e.links.empty()) return;
    const auto& [to, obj] = e.links[target % e.links.size()];
    const std::string path = "/" + to;
    made = (kind == 2 ? H5Lcreate_hard(file, path.c_str(), file, name->c_str(), lcpl, H5P_DEFAULT)
                      : H5Lcreate_soft(path.c_str(), file, name->c_str(), lcpl, H5P_DEFAULT)) >= 0;
    // Note [Each tensor under one name]: a file with a second name for an
    // object is refused, whatever the object.
    o = obj;
    o.kind = Obj::Alias;
  } else if (kind == 4) {
    made = H5Lcreate_soft("/nowhere", file, name->c_str(), lcpl, H5P_DEFAULT) >= 0;
    o.kind = Obj::Dangling;
  } else {
    o.data = values(2, static_cast<uint8_t>(target));
    made = make_away(file, *name, kind - 5, o.data, lcpl);
    o.kind = Obj::Outside;
  }
  if (made) e.links.emplace_back(*name, std::move(o));
}

/// Writes the file `in` describes to `path`; what it holds into `e`.
void write_file(const std::string& path, Bytes& in, Expected& e, bool& tracked) {
  tracked = in.u8() & 1;
  h5::Id fcpl(BT_H5_CHECK(H5Pcreate(H5P_FILE_CREATE)), H5Pclose);
  if (tracked) BT_H5_CHECK(H5Pset_link_creation_order(fcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED));
  h5::Id file(BT_H5_CHECK(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl, H5P_DEFAULT)), H5Fclose);
  h5::Id lcpl(BT_H5_CHECK(H5Pcreate(H5P_LINK_CREATE)), H5Pclose);
  BT_H5_CHECK(H5Pset_char_encoding(lcpl, H5T_CSET_UTF8));
  for (int ops = 0; ops < 16 && !in.done(); ++ops) {
    switch (in.pick(4)) {
      case 0:
        add_attr(file, in, e);
        break;
      case 1:
        add_f32(file, lcpl, in, e);
        break;
      case 2:
        add_other(file, lcpl, in, e);
        break;
      default:
        add_link(file, lcpl, in, e);
    }
  }
  BT_H5_CHECK(H5Fclose(file.release()));
}

/// Whether a reader must accept the file `e` describes.
bool acceptable(const Expected& e) {
  const auto f = e.attrs.find("format");
  const auto v = e.attrs.find("version");
  if (f == e.attrs.end() || f->second.kind != Attr::Text || f->second.text != kWeightsFormat) return false;
  if (v == e.attrs.end() || v->second.kind != Attr::Int || v->second.value < 1 ||
      v->second.value > kWeightsVersion)
    return false;
  for (const auto& [name, a] : e.attrs)
    if (a.kind == Attr::Bad) return false;
  for (const auto& [name, o] : e.links)
    if (o.kind != Obj::F32) return false;
  return true;
}

}  // namespace
}  // namespace bt::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace bt;
  using namespace bt::fuzz;
  static const bool once = keep_freed_memory();
  (void)once;
  const std::string path = folder() + "/weights.h5";
  Bytes in(data, size);
  Expected e;
  bool tracked = false;
  try {
    write_file(path, in, e, tracked);
  } catch (const Error&) {  // HDF5 refused to write what the input describes: nothing to read
    return 0;
  }

  std::vector<std::vector<float>> buffers;
  WeightFileInfo info;
  try {
    info = read_weight_file(path, [&](const WeightEntry& t) {
      // Only data the file holds: the target never writes more than kMaxWritten elements.
      int64_t n = 1;
      for (const int64_t d : t.shape)
        if (d < 0 || __builtin_mul_overflow(n, std::max<int64_t>(d, 1), &n)) __builtin_trap();
      if (std::count(t.shape.begin(), t.shape.end(), 0) > 0) n = 0;
      if (n > kMaxWritten) __builtin_trap();
      buffers.emplace_back(static_cast<size_t>(n), -1.0f);
      return buffers.back().data();
    });
  } catch (const InternalError&) {
    __builtin_trap();
  } catch (const Error& err) {  // refused
    if (std::getenv("BT_FUZZ_VERBOSE")) std::fprintf(stderr, "refused: %s\n", err.what());
    if (acceptable(e)) __builtin_trap();
    return 0;
  }
  if (!acceptable(e)) __builtin_trap();

  // Accepted: the attributes and tensors are exactly what was written.
  for (const auto& [name, a] : e.attrs) {
    if (name == "format" || name == "version") continue;
    if (a.kind == Attr::Int && (!info.attrs.count(name) || info.attrs.at(name) != a.value)) __builtin_trap();
    if (a.kind == Attr::Text && (!info.text_attrs.count(name) || info.text_attrs.at(name) != a.text))
      __builtin_trap();
  }
  if (info.attrs.size() + info.text_attrs.size() + 2 != e.attrs.size()) __builtin_trap();
  std::vector<std::pair<std::string, Obj>> links = e.links;
  if (!tracked)
    std::sort(links.begin(), links.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  if (info.tensors.size() != links.size() || buffers.size() != links.size()) __builtin_trap();
  for (size_t i = 0; i < links.size(); ++i) {
    const auto& [name, o] = links[i];
    if (info.tensors[i].name != name || info.tensors[i].shape != o.shape) __builtin_trap();
    if (buffers[i].size() != o.data.size() ||
        (!o.data.empty() &&
         std::memcmp(buffers[i].data(), o.data.data(), o.data.size() * sizeof(float)) != 0))
      __builtin_trap();
  }
  std::vector<WeightEntry> wanted;
  for (const auto& [name, o] : e.links) wanted.push_back({name, o.shape});
  try {
    (void)match_weights(path, info.tensors, wanted);
    check_weight_attrs(path, info.attrs, info.attrs);
  } catch (const Error&) {
    __builtin_trap();
  }
  if (!wanted.empty()) {  // one parameter fewer: the file has a tensor too many
    wanted.pop_back();
    bool refused = false;
    try {
      (void)match_weights(path, info.tensors, wanted);
    } catch (const InternalError&) {
      __builtin_trap();
    } catch (const Error&) {
      refused = true;
    }
    if (!refused) __builtin_trap();
  }
  return 0;
}
