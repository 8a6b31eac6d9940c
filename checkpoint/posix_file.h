// PosixFile: a file descriptor with the positioned reads and writes that
// checkpoint data goes through (HDF5 lays the files out; our threads move
// the bytes, shard_file.h). Every failure throws bt::Error naming the path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace bt::ckpt {

class PosixFile {
 public:
  enum class Mode { Read, Write };
  /// Opens an existing file. Throws naming `path` when it cannot.
  PosixFile(std::string path, Mode mode);
  ~PosixFile();
  PosixFile(const PosixFile&) = delete;
  PosixFile& operator=(const PosixFile&) = delete;

  /// All `n` bytes at `offset`, retrying short writes. A full disk names the
  /// fix (free space or move checkpoint.dir).
  void write_at(const void* data, size_t n, uint64_t offset) const;
  /// All `n` bytes at `offset`; a short read (the file ends early) says the
  /// file is truncated.
  void read_at(void* data, size_t n, uint64_t offset) const;
  /// Reserves the disk blocks of [0, bytes) without changing the file's size
  /// (fallocate(2) FALLOC_FL_KEEP_SIZE), so a full disk fails here, before
  /// any data is written. A file system without fallocate is not an error.
  void reserve(uint64_t bytes) const;
  /// Starts writing back [offset, offset + n) (sync_file_range(2)), so the
  /// disk works while more data is being written; a hint, never an error.
  void start_writeback(uint64_t offset, size_t n) const;
  /// fsync(2), then close(2); both checked.
  void sync_and_close();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

/// " -- the disk is full; ..." for ENOSPC and EDQUOT, else "".
const char* full_disk_hint(int err);

/// Free bytes for an unprivileged writer on the file system holding `dir`;
/// UINT64_MAX when it cannot be found out.
uint64_t free_bytes(const std::string& dir);

}  // namespace bt::ckpt
