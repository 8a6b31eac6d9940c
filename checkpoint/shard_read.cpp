// ShardReader (Note [Checkpoint data path]), crc32_of and unlocked_file_access.
#include <algorithm>
#include <cstring>
#include <filesystem>

#include <hdf5.h>
#include <zlib.h>

#include "checkpoint/h5_check.h"
#include "checkpoint/h5_util.h"
#include "checkpoint/posix_file.h"
#include "checkpoint/shard_reader.h"

namespace bt::ckpt {

namespace fs = std::filesystem;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoint data is written as host floats (f32le)");

uint32_t crc32_of(const float* data, int64_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* bytes = reinterpret_cast<const Bytef*>(data);
  size_t left = static_cast<size_t>(n) * sizeof(float);
  while (left > 0) {  // zlib takes uInt lengths
    const uInt step = static_cast<uInt>(std::min<size_t>(left, size_t{1} << 30));
    crc = crc32(crc, bytes, step);
    bytes += step;
    left -= step;
  }
  return static_cast<uint32_t>(crc);
}

h5::Id unlocked_file_access() {
  h5::Id fapl(BT_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
  BT_H5_CHECK(H5Pset_file_locking(fapl, false, true));
  return fapl;
}

struct ShardReader::File {
  h5::Id h5;
  PosixFile raw;
};

ShardReader::ShardReader(std::string dir) : dir_(std::move(dir)), pool_(IoPool::default_threads(), 64) {
  detail::h5_silence_auto_errors();
}

ShardReader::~ShardReader() = default;

std::string ShardReader::where_of(const SavedPiece& p) const {
  return cat("checkpoint file '", dir_, "/", p.file, "', dataset '", p.dataset, "'");
}

ShardReader::File& ShardReader::file(const std::string& name) {
  auto it = files_.find(name);
  if (it != files_.end()) return *it->second;
  // `name` passed check_file_name when the index was read; a link may still
  // lead out (Note [Files confined to their checkpoint]).
  const std::string path = dir_ + "/" + name;
  std::error_code ec;
  if (fs::is_symlink(path, ec)) {
    const fs::path target = fs::weakly_canonical(path, ec), folder = fs::weakly_canonical(dir_, ec);
    BT_CHECK(target.parent_path() == folder, "checkpoint file '", path, "' is a symbolic link to '",
             target.string(),
             "', outside the checkpoint's folder; the checkpoint is corrupt (Note [Files "
             "confined to their checkpoint])");
  }
  // Opening a FIFO or a device for reading would block or read without end.
  const fs::file_status st = fs::status(path, ec);
  BT_CHECK(!fs::exists(st) || fs::is_regular_file(st), "checkpoint file '", path,
           "' is not a regular file (a FIFO, a device or a folder); the checkpoint is corrupt");
  h5::Id h5(H5Fopen(path.c_str(), H5F_ACC_RDONLY, unlocked_file_access()), H5Fclose);
  BT_CHECK(h5.get() >= 0, "cannot open checkpoint file '", path, "': ", h5::error_stack(),
           " (missing, truncated or corrupt)");
  auto f = std::unique_ptr<File>(new File{std::move(h5), PosixFile(path, PosixFile::Mode::Read)});
  return *files_.emplace(name, std::move(f)).first->second;
}

namespace {

/// Saved piece `p`'s dataset in `file`, through no external link (Note [Only
/// the file we were given] in h5_util.h).
h5::Id open_piece(hid_t file, const SavedPiece& p) {
  const h5::Id dapl = h5::local_access(H5P_DATASET_ACCESS);
  return h5::Id(BT_H5_CHECK(H5Dopen2(file, p.dataset.c_str(), dapl)), H5Dclose);
}

/// Where a saved piece's bytes lie: its dataset's offset (HADDR_UNDEF for a
/// chunked dataset of format version 1), after checking its size and that
/// its data is in this file.
haddr_t locate(hid_t file, const SavedPiece& p, const std::string& where) {
  h5::Id dset = open_piece(file, p);
  h5::Id space(BT_H5_CHECK(H5Dget_space(dset)), H5Sclose);
  hsize_t dims[1] = {0};
  BT_CHECK(H5Sget_simple_extent_ndims(space) == 1, where, " is not 1-D; the checkpoint is corrupt");
  BT_H5_CHECK(H5Sget_simple_extent_dims(space, dims, nullptr));
  BT_CHECK(static_cast<int64_t>(dims[0]) == p.end - p.begin, where, " holds ", dims[0],
           " elements but the index says ", p.end - p.begin, "; the checkpoint is corrupt");
  h5::Id type(BT_H5_CHECK(H5Dget_type(dset)), H5Tclose);
  BT_CHECK(BT_H5_CHECK(H5Tequal(type, H5T_IEEE_F32LE)) > 0, where,
           " is not float32; the checkpoint is corrupt");
  h5::Id dcpl(BT_H5_CHECK(H5Dget_create_plist(dset)), H5Pclose);
  h5::check_data_in_file(dcpl, where);
  return H5Pget_layout(dcpl) == H5D_CONTIGUOUS ? H5Dget_offset(dset) : HADDR_UNDEF;
}

}  // namespace

void ShardReader::read(const std::vector<Range>& ranges) {
  try {
    queue(ranges);
  } catch (...) {
    try {  // the queued blocks write into the caller's buffers: let them finish
      pool_.wait();
    } catch (...) {
    }
    throw;
  }
  pool_.wait();
}

void ShardReader::queue(const std::vector<Range>& ranges) {
  // Each piece is located once, and each format-1 piece read once, however
  // many of the call's ranges fall in it (Note [Partial reads of format 1]).
  std::map<const SavedPiece*, haddr_t> located;
  std::map<const SavedPiece*, std::vector<Range>> legacy;
  for (const Range& r : ranges) {
    const SavedPiece& p = *r.piece;
    BT_ASSERT(p.begin <= r.lo && r.lo < r.hi && r.hi <= p.end);
    const std::string where = where_of(p);
    File& f = file(p.file);
    auto loc = located.find(&p);
    if (loc == located.end()) {
      const haddr_t at = h5::with_context(cat("cannot read ", where, " (the file is damaged)"),
                                          [&] { return locate(f.h5, p, where); });
      loc = located.emplace(&p, at).first;
    }
    const haddr_t at = loc->second;
    if (p.block == 0 || at == HADDR_UNDEF) {
      BT_CHECK(p.block == 0, where, " is not a contiguous dataset; the checkpoint is corrupt");
      legacy[&p].push_back(r);
      continue;
    }
    // Whole blocks, each checked before use: straight into `out` when the
    // block lies inside [lo, hi), else through a buffer.
    const PosixFile* raw = &f.raw;
    for (int64_t b = (r.lo - p.begin) / p.block; p.begin + b * p.block < r.hi; ++b) {
      pool_.submit([raw, &p, r, b, at, where] {
        const int64_t first = p.begin + b * p.block, n = std::min(p.block, p.end - first);
        const bool inside = first >= r.lo && first + n <= r.hi;
        std::vector<float> buf(inside ? 0 : static_cast<size_t>(n));
        float* dst = inside ? r.out + (first - r.lo) : buf.data();
        raw->read_at(dst, static_cast<size_t>(n) * 4, at + static_cast<uint64_t>(first - p.begin) * 4);
        BT_CHECK(crc32_of(dst, n) == p.block_crc32[static_cast<size_t>(b)], where, " elements [", first, ", ",
                 first + n, ") do not match their crc32 in the index: the checkpoint is corrupt");
        if (!inside) {
          const int64_t lo = std::max(first, r.lo), hi = std::min(first + n, r.hi);
          std::memcpy(r.out + (lo - r.lo), buf.data() + (lo - first), static_cast<size_t>(hi - lo) * 4);
        }
      });
    }
  }
  for (const auto& [piece, piece_ranges] : legacy) read_legacy(*piece, piece_ranges);
}

// Note [Partial reads of format 1]: a format-1 piece has one crc32, of the
// whole piece. Its chunks' Fletcher-32 proves each chunk intact, but not that
// the dataset holds the piece the index describes (a rank file of another
// checkpoint, two pieces of one name), and a dataset without the filter, or
// a contiguous one, proves nothing. So a partial read of a format-1 piece
// reads the whole piece, checks its crc32 and then copies the range: as safe
// as a whole read, at the cost of reading more (format 2's blocks exist for
// this). The ranges of one read() that fall in the same piece share one read
// of it (a resharded load asks for several).
void ShardReader::read_legacy(const SavedPiece& p, const std::vector<Range>& ranges) {
  const std::string where = where_of(p);
  const bool whole = ranges.size() == 1 && ranges[0].lo == p.begin && ranges[0].hi == p.end;
  std::vector<float> buf(whole ? 0 : static_cast<size_t>(p.end - p.begin));
  float* dst = whole ? ranges[0].out : buf.data();
  h5::with_context(
      cat("cannot read ", where, " (corrupt: a checksum does not match, or the file is damaged)"), [&] {
        h5::Id dset = open_piece(file(p.file).h5, p);
        BT_H5_CHECK(H5Dread(dset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst));
      });
  ++legacy_piece_reads_;
  BT_CHECK(crc32_of(dst, p.end - p.begin) == p.crc32, where,
           " does not match its crc32 in the index: the checkpoint is corrupt");
  if (!whole)
    for (const Range& r : ranges)
      std::memcpy(r.out, dst + (r.lo - p.begin), static_cast<size_t>(r.hi - r.lo) * sizeof(float));
}

}  // namespace bt::ckpt
