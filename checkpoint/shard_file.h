// One rank's HDF5 file of a checkpoint: a 1-D float32 dataset per state
// piece at "<tensor name>/<begin>" (e.g. "param/h.0.ln_1.weight/0"), chunked
// with HDF5's Fletcher-32 filter (every chunk read is checked), with int64
// attributes begin, end and crc32 (zlib crc32 of the piece's bytes). Files are
// opened without HDF5 file locking (Note [HDF5 file locking]).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/index.h"
#include "runtime/dist/strategy.h"

namespace bt::ckpt {

// Note [HDF5 file locking]: HDF5 >= 1.10 takes flock(2)/fcntl locks on the
// files it opens. On NFS and Lustre those locks are unsupported or slow and
// can fail an open outright. A checkpoint file has exactly one writer and is
// read only after its checkpoint is committed (renamed into place), so no
// lock is needed: every open here disables it (H5Pset_file_locking(false),
// what HDF5_USE_FILE_LOCKING=FALSE does for other readers such as h5py).

/// zlib crc32 of `n` floats.
uint32_t crc32_of(const float* data, int64_t n);

/// Writes `pieces` (any device) to a new file `path`, fsyncs it, and returns
/// the index entries (file name `file_name`) with their checksums. Throws
/// bt::Error naming `path` on any failure (a full disk included).
std::vector<std::pair<std::string, SavedPiece>> write_shard_file(const std::string& path,
                                                                 const std::string& file_name,
                                                                 const std::vector<dist::StatePiece>& pieces);

/// Open rank files of one checkpoint, read by ranges.
class ShardReader {
 public:
  explicit ShardReader(std::string dir);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  /// Reads elements [lo, hi) of saved piece `p` (lo, hi within [p.begin, p.end))
  /// into `out`. A read of the whole piece also checks its crc32. Throws
  /// bt::Error naming the file and dataset for a missing file or dataset, a
  /// Fletcher-32 or crc32 mismatch (corruption) or a short file.
  void read(const SavedPiece& p, int64_t lo, int64_t hi, float* out);

 private:
  int64_t file(const std::string& name);
  std::string dir_;
  std::map<std::string, int64_t> files_;  // open hid_t per file name
};

}  // namespace bt::ckpt
