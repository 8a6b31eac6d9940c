#include "checkpoint/h5_util.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "checkpoint/h5_check.h"

namespace bt::h5 {

void write_int_attr(hid_t loc, const std::string& name, int64_t value) {
  Id space(BT_H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose);
  Id attr(BT_H5_CHECK(H5Acreate2(loc, name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT)),
          H5Aclose);
  BT_H5_CHECK(H5Awrite(attr, H5T_NATIVE_INT64, &value));
}

void write_string_attr(hid_t loc, const std::string& name, const std::string& value) {
  Id type(BT_H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
  BT_H5_CHECK(H5Tset_size(type, H5T_VARIABLE));
  BT_H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8));
  Id space(BT_H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose);
  Id attr(BT_H5_CHECK(H5Acreate2(loc, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
  const char* s = value.c_str();
  BT_H5_CHECK(H5Awrite(attr, type, &s));
}

std::string read_string_attr(hid_t attr, hid_t file_type) {
  if (BT_H5_CHECK(H5Tis_variable_str(file_type)) > 0) {
    Id mem(BT_H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
    BT_H5_CHECK(H5Tset_size(mem, H5T_VARIABLE));
    BT_H5_CHECK(H5Tset_cset(mem, H5Tget_cset(file_type)));
    char* s = nullptr;
    BT_H5_CHECK(H5Aread(attr, mem, &s));
    std::string out = s ? s : "";
    if (s) H5free_memory(s);
    return out;
  }
  const size_t n = H5Tget_size(file_type);
  BT_CHECK(n > 0, "a string attribute has size 0");
  Id mem(BT_H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
  BT_H5_CHECK(H5Tset_size(mem, n + 1));  // room for the terminator HDF5 adds for NULLTERM
  BT_H5_CHECK(H5Tset_strpad(mem, H5T_STR_NULLTERM));
  std::string buf(n + 1, '\0');
  BT_H5_CHECK(H5Aread(attr, mem, buf.data()));
  buf.resize(std::strlen(buf.c_str()));
  // Trailing spaces are padding only in a space-padded string; in a null-padded
  // or null-terminated one they are part of the value.
  if (H5Tget_strpad(file_type) == H5T_STR_SPACEPAD)
    while (!buf.empty() && buf.back() == ' ') buf.pop_back();
  return buf;
}

namespace {

herr_t refuse_external_link(const char*, const char*, const char*, const char*, unsigned*, hid_t, void*) {
  return -1;
}

}  // namespace

Id local_access(hid_t cls) {
  Id plist(BT_H5_CHECK(H5Pcreate(cls)), H5Pclose);
  BT_H5_CHECK(H5Pset_elink_cb(plist, refuse_external_link, nullptr));
  return plist;
}

void check_data_in_file(hid_t dcpl, const std::string& where) {
  BT_CHECK(H5Pget_layout(dcpl) != H5D_VIRTUAL, where,
           " is a virtual dataset, whose data lies in other files; the file may hold only its own data");
  BT_CHECK(BT_H5_CHECK(H5Pget_external_count(dcpl)) == 0, where,
           " keeps its data in external files; the file may hold only its own data");
}

namespace {

herr_t collect_error(unsigned, const H5E_error2_t* e, void* out) {
  auto* v = static_cast<std::vector<std::string>*>(out);
  if (e && e->desc && *e->desc && std::find(v->begin(), v->end(), e->desc) == v->end())
    v->emplace_back(e->desc);
  return 0;
}

}  // namespace

std::string error_stack() {
  std::vector<std::string> msgs;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_error, &msgs);
  H5Eclear2(H5E_DEFAULT);
  std::string out;
  for (const auto& m : msgs) out += (out.empty() ? "" : "; ") + m;
  return out.empty() ? "unknown HDF5 error" : out;
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) {
    BT_CHECK(directory, "cannot open '", path, "' to sync it: ", std::strerror(errno));
    return;  // best effort for directories
  }
  const bool ok = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  BT_CHECK(ok || directory, "fsync of '", path, "' failed: ", std::strerror(err));
}

}  // namespace bt::h5
