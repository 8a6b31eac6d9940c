// For the fuzz targets of our HDF5 readers (fuzz_weights.cpp,
// fuzz_ckpt_shard.cpp): the fuzzer's bytes read as a description of an HDF5
// file, which the target writes with the HDF5 C API before our reader reads
// it. Fuzzing libhdf5's own parser byte by byte would mostly find bugs in
// libhdf5; what we fuzz is what our code does with any file HDF5 can
// describe, hostile ones included.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <hdf5.h>

#include "checkpoint/h5_check.h"
#include "checkpoint/h5_util.h"
#include "tests/fuzz/fuzz_file.h"

namespace bt::fuzz {

/// The fuzzer's bytes, front to back; past the end every read is 0.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  bool done() const { return p_ == end_; }
  uint8_t u8() { return p_ < end_ ? *p_++ : 0; }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{u8()} << (8 * i);
    return v;
  }
  /// One of `n` choices.
  size_t pick(size_t n) { return u8() % n; }
  /// A length byte (at most `max`), then that many bytes.
  std::string raw(size_t max) {
    std::string s(u8() % (max + 1), '\0');
    for (char& c : s) c = static_cast<char>(u8());
    return s;
  }
  /// One of `common` (byte < 0xf0), else raw bytes.
  std::string choose(const std::vector<std::string>& common, size_t max = 24) {
    const uint8_t b = u8();
    return b < 0xf0 ? common[b % common.size()] : raw(max);
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

/// Once per process: HDF5's errors silenced, and its free lists unbounded,
/// so that the large structures each open file needs are reused rather than
/// mapped and cleared afresh for every input (most of the time otherwise).
inline bool keep_freed_memory() {
  detail::h5_silence_auto_errors();
  return H5set_free_list_limits(-1, -1, -1, -1, -1, -1) >= 0;
}

/// `n` float values from `seed`: ordinary numbers, and for some seeds
/// infinities, NaNs with payloads and denormals (compared bitwise).
inline std::vector<float> values(int64_t n, uint8_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits = static_cast<uint32_t>(i + 1) * 2654435761u ^ (uint32_t{seed} * 40503u);
    if (seed % 4 != 0) bits = (bits & 0x807fffffu) | (0x3f000000u + ((bits >> 8) & 0x01800000u));  // finite
    std::memcpy(&v[static_cast<size_t>(i)], &bits, 4);
  }
  return v;
}

/// Makes `name` at `loc` a float32 dataset of `data` whose data lies in
/// another file (folder()/away_K.h5 or away_K.bin, K counting the calls):
/// `how` 0 an external link to that file's /x, 1 external raw storage, 2 a
/// virtual dataset over /x. False when HDF5 refuses. The data is what the
/// reader expects, so only following the file's references to other files
/// tells a reader that accepts it from one that refuses.
inline bool make_away(hid_t loc, const std::string& name, size_t how, const std::vector<float>& data,
                      hid_t lcpl) {
  static unsigned calls = 0;
  const std::string k = std::to_string(calls++ % 4);
  const hsize_t dims[1] = {data.size()};
  h5::Id space(H5Screate_simple(1, dims, nullptr), H5Sclose);
  if (space.get() < 0) return false;
  if (how == 1) {
    const std::string raw = write_input("away_" + k + ".bin", reinterpret_cast<const uint8_t*>(data.data()),
                                        data.size() * sizeof(float));
    h5::Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    if (H5Pset_external(dcpl, raw.c_str(), 0, data.size() * sizeof(float)) < 0) return false;
    h5::Id d(H5Dcreate2(loc, name.c_str(), H5T_IEEE_F32LE, space, lcpl, dcpl, H5P_DEFAULT), H5Dclose);
    return d.get() >= 0;
  }
  const std::string other = folder() + "/away_" + k + ".h5";
  {
    h5::Id f(H5Fcreate(other.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (f.get() < 0) return false;
    h5::Id d(H5Dcreate2(f, "x", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
    if (d.get() < 0 || H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) < 0)
      return false;
  }
  if (how == 0) return H5Lcreate_external(other.c_str(), "/x", loc, name.c_str(), lcpl, H5P_DEFAULT) >= 0;
  h5::Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (H5Pset_virtual(dcpl, space, other.c_str(), "/x", space) < 0) return false;
  h5::Id d(H5Dcreate2(loc, name.c_str(), H5T_IEEE_F32LE, space, lcpl, dcpl, H5P_DEFAULT), H5Dclose);
  return d.get() >= 0;
}

}  // namespace bt::fuzz
