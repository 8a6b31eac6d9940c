// Reading one rank's file of a checkpoint (the file: shard_file.h), and what
// reading and writing it share: the checksum block, crc32 and the unlocked
// file access. Free of the runtime, so the `ckpt_shard` fuzz target
// (tests/fuzz/fuzz_ckpt_shard.cpp) builds it alone.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/h5_util.h"
#include "checkpoint/index.h"
#include "checkpoint/io_pool.h"

namespace bt::ckpt {

/// File-access properties with HDF5 file locking off (Note [HDF5 file locking]).
h5::Id unlocked_file_access();

/// Elements per checksummed block (4 MiB of f32).
inline constexpr int64_t kCrcBlock = int64_t{1} << 20;

/// zlib crc32 of `n` floats.
uint32_t crc32_of(const float* data, int64_t n);

/// Open rank files of one checkpoint, read by ranges.
class ShardReader {
 public:
  explicit ShardReader(std::string dir);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  /// Elements [lo, hi) of saved piece `piece` (within [begin, end)) into `out`.
  struct Range {
    const SavedPiece* piece;
    int64_t lo, hi;
    float* out;
  };
  /// Reads every range, in parallel. Throws bt::Error naming the file and
  /// dataset for a missing file or dataset, a checksum mismatch (corruption),
  /// a truncated file, or data in another file (Note [Only the file we were
  /// given] in h5_util.h). Every element is checked against a crc32 of the
  /// index before it is used (format 1: Note [Partial reads of format 1]).
  void read(const std::vector<Range>& ranges);
  /// How many format-1 pieces were read (each whole) so far: the tests'
  /// window on Note [Partial reads of format 1].
  int64_t legacy_piece_reads() const { return legacy_piece_reads_; }

 private:
  struct File;
  File& file(const std::string& name);
  /// "checkpoint file 'DIR/FILE', dataset 'D'": how errors name a piece.
  std::string where_of(const SavedPiece& p) const;
  void queue(const std::vector<Range>& ranges);
  /// Format version 1 (chunked, via HDF5): the whole piece, then each range.
  void read_legacy(const SavedPiece& p, const std::vector<Range>& ranges);
  std::string dir_;
  int64_t legacy_piece_reads_ = 0;
  std::map<std::string, std::unique_ptr<File>> files_;
  IoPool pool_;
};

}  // namespace bt::ckpt
