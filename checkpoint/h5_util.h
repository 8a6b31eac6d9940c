// Small helpers over the HDF5 C API shared by the weights files and the
// checkpoints: an owning id, string/integer attributes, HDF5's error stack as
// text, and fsync of files and directories.
#pragma once

#include <cstdint>
#include <string>

#include <hdf5.h>

#include "kernels/common/error.h"

namespace bt::h5 {

/// Owns an HDF5 id and closes it with `close` (errors on this path are ignored;
/// use release() + an explicit checked close where a failed close matters).
class Id {
 public:
  Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Id() {
    if (id_ >= 0) close_(id_);
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  Id(Id&& o) noexcept : id_(o.release()), close_(o.close_) {}
  Id& operator=(Id&&) = delete;
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  hid_t release() {
    const hid_t id = id_;
    id_ = -1;
    return id;
  }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

/// Runs `fn`; an HDF5 failure inside becomes a bt::Error that names the file and
/// what was being done (HDF5's own message follows).
template <typename Fn>
auto with_context(const std::string& what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const InternalError&) {
    throw;
  } catch (const Error& e) {
    const std::string m = e.what();
    if (m.rfind("HDF5 error", 0) != 0) throw;  // already one of our messages
    throw Error(cat(what, ": ", m));
  }
}

void write_int_attr(hid_t loc, const std::string& name, int64_t value);
/// A variable-length UTF-8 string, as h5py writes a Python str.
void write_string_attr(hid_t loc, const std::string& name, const std::string& value);
/// Reads a string attribute stored as a variable- or fixed-length string.
std::string read_string_attr(hid_t attr, hid_t file_type);
/// Note [Only the file we were given]: an HDF5 file can name other files --
/// an external link to an object in another HDF5 file, a dataset whose raw
/// data lies in external files (H5Pset_external), a virtual dataset mapping
/// other files' datasets. A weights or checkpoint file we did not write could
/// use them to make us open or read any file (a device or a FIFO that never
/// ends, a secret that becomes model weights), so our readers follow none:
/// objects are opened under local_access(), which refuses external links,
/// and a dataset's data must be its own (check_data_in_file).

/// Access properties of class `cls` (H5P_LINK_ACCESS for H5Oopen,
/// H5P_DATASET_ACCESS for H5Dopen2) under which opening refuses to follow an
/// external link (Note [Only the file we were given]).
Id local_access(hid_t cls);
/// Throws bt::Error naming `where` unless the data of the dataset with
/// creation properties `dcpl` lies in its own file: no external raw storage,
/// not a virtual dataset (Note [Only the file we were given]).
void check_data_in_file(hid_t dcpl, const std::string& where);
/// Every message on HDF5's error stack, outermost first, joined; clears the stack.
/// (BT_H5_CHECK keeps one message; opening a file needs the inner ones, e.g.
/// "truncated file: eof = ...".)
std::string error_stack();
/// fsync(2) of a file (failure throws) or a directory (best effort).
void fsync_path(const std::string& path, bool directory);

}  // namespace bt::h5
