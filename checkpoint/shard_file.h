// One rank's HDF5 file of a checkpoint: a contiguous 1-D float32 dataset per
// state piece at "<tensor name>/<begin>" (e.g. "param/h.0.ln_1.weight/0"),
// with attributes begin, end, crc32 (zlib crc32 of the piece's bytes),
// crc32_block and block_crc32 (the crc32 of each block of crc32_block
// elements). HDF5 lays the file out; the data moves through our own parallel
// positioned reads and writes (Note [Checkpoint data path]). Files are opened
// without HDF5 file locking (Note [HDF5 file locking]). Reading them, and what
// reading and writing share, is shard_reader.h.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/index.h"
#include "checkpoint/shard_reader.h"
#include "runtime/dist/strategy.h"

namespace bt::ckpt {

// Note [HDF5 file locking]: HDF5 >= 1.10 takes flock(2)/fcntl locks on the
// files it opens. On NFS and Lustre those locks are unsupported or slow and
// can fail an open outright. A checkpoint file has exactly one writer and is
// read only after its checkpoint is committed (renamed into place), so no
// lock is needed: every open here disables it (H5Pset_file_locking(false),
// what HDF5_USE_FILE_LOCKING=FALSE does for other readers such as h5py).

// Note [Checkpoint data path]: HDF5 writes only the file's metadata; the
// tensor bytes bypass it.
//   - Every dataset is contiguous with its space allocated at creation
//     (H5D_ALLOC_TIME_EARLY, no fill), so H5Dget_offset gives where its bytes
//     go. The metadata is flushed first; then the whole file's blocks are
//     reserved (fallocate), so a full disk fails before any data is written
//     and HDF5 never sees a failed write (HDF5 1.10 cannot recover from a
//     failed flush: the half-closed file crashes the library at exit).
//   - The data goes out in blocks of kCrcBlock elements: a pool of threads
//     computes each block's crc32 and pwrite(2)s it, and starts its writeback
//     at once (sync_file_range), so several requests keep the disk busy while
//     the caller copies the next blocks off the GPU into pinned buffers. The
//     checksums then go into the attributes created for them (in place), the
//     file is closed and fsynced.
//   - Reads find the same offsets and pread(2) whole blocks in parallel: a
//     block is checked against its crc32 before any of it is used, so a
//     partial read (a reshard) is as safe as a whole one.
// Host memory stays bounded by the blocks in flight (IoPool's queue).

/// Writes `pieces` (any device) to a new file `path`, fsyncs it, and returns
/// the index entries (file name `file_name`) with their checksums. Throws
/// bt::Error naming `path` on any failure (a full disk included), after
/// removing the file.
/// `background`: the I/O threads yield the CPU to training (IoPool).
std::vector<std::pair<std::string, SavedPiece>> write_shard_file(const std::string& path,
                                                                 const std::string& file_name,
                                                                 const std::vector<dist::StatePiece>& pieces,
                                                                 bool background = false);

}  // namespace bt::ckpt
