// libFuzzer target: the reader of a checkpoint's rank files (ShardReader,
// checkpoint/shard_reader.h) on hostile or damaged files. The input
// describes up to two rank files (tests/fuzz/fuzz_h5.h) and the index
// entries of their pieces: format 2 (contiguous datasets, a crc32 per block
// of 1 to 16 elements) or format 1 (chunked with Fletcher-32, one crc32 per
// piece); each piece's dataset as written by BluTrain or missing, of another
// length, rank, type or layout, without its data, or with its data in
// another file; a few bytes of a piece's data flipped; a rank file
// truncated, missing, or a symbolic link out of the checkpoint's folder or
// within it. The index entries are the ones BluTrain would write for the
// intended data (and pass piece_from_json). Then ranges of the pieces are
// read, in one call or one call each. The reader must accept or throw
// bt::Error -- never crash, hang, leak or write outside a range's buffer.
// What it accepts is exactly the intended data of every range, read from no
// file outside the checkpoint's folder (Note [Files confined to their
// checkpoint], Note [Only the file we were given]); and a read that touches
// only pieces written as BluTrain writes them, no flipped block, and sound
// files is accepted.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fcntl.h>
#include <hdf5.h>
#include <pthread.h>
#include <unistd.h>

#include "checkpoint/h5_check.h"
#include "checkpoint/h5_util.h"
#include "checkpoint/index.h"
#include "checkpoint/shard_reader.h"
#include "kernels/common/error.h"
#include "tests/fuzz/fuzz_file.h"
#include "tests/fuzz/fuzz_h5.h"

namespace bt::fuzz {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kTensors = {"param/wte", "adam_m/wte", "adam_v/h.0.ln_1.weight",
                                           "param/lm_head", "param"};

/// How a piece's dataset is written.
enum Kind { Sound, Missing, OtherLength, OtherRank, OtherType, Unallocated, OtherLayout, Compact, Outside };

struct Piece {
  ckpt::SavedPiece saved;
  std::vector<float> truth;
  Kind kind = Sound;
  int64_t flip_at = -1;  // the element with a flipped bit, if any
  uint8_t flip_byte = 0, flip_mask = 0;
  int64_t chunk = 0;     // chunked: elements per chunk
  bool made = false;     // its dataset was created (another piece may have taken its name)
  bool outside = false;  // its dataset's data lies in another file
};

struct Range {
  size_t piece;
  int64_t lo, hi;
};

Kind kind_of(uint8_t b) {
  static const Kind kinds[] = {Missing,     OtherLength, OtherRank, OtherType,
                               Unallocated, OtherLayout, Compact,   Outside};
  return b < 0x80 ? Sound : kinds[b % 8];
}

/// Every ShardReader starts and ends its I/O threads; AddressSanitizer
/// clears the shadow of a thread's whole stack each time, which for the
/// default 8 MiB stacks was most of an input's time. Theirs need little.
bool small_thread_stacks() {
  pthread_attr_t attr;
  return pthread_attr_init(&attr) == 0 && pthread_attr_setstacksize(&attr, 256 << 10) == 0 &&
         pthread_setattr_default_np(&attr) == 0 && pthread_attr_destroy(&attr) == 0;
}

/// Flips byte `at` of `path` with `mask`.
void flip(const std::string& path, uint64_t at, uint8_t mask) {
  const int fd = ::open(path.c_str(), O_RDWR);
  uint8_t b = 0;
  if (fd < 0 || ::pread(fd, &b, 1, static_cast<off_t>(at)) != 1) std::abort();
  b ^= mask;
  if (::pwrite(fd, &b, 1, static_cast<off_t>(at)) != 1 || ::close(fd) != 0) std::abort();
}

/// Writes piece `p`'s dataset into `file` as its kind says; returns where the
/// byte to flip lies (0: none, and then no flip).
uint64_t write_piece(hid_t file, hid_t lcpl, Piece& p, bool legacy, uint8_t seed) {
  const std::string& name = p.saved.dataset;
  const int64_t n = p.saved.end - p.saved.begin;
  if (p.kind == Missing) return 0;
  if (p.kind == Outside) {
    p.made = p.outside = make_away(file, name, seed % 3, p.truth, lcpl);
    return 0;
  }
  hsize_t dims[2] = {static_cast<hsize_t>(n), 0};
  int rank = 1;
  if (p.kind == OtherLength) dims[0] = n > 1 && (seed & 1) ? n - 1 : n + 1 + seed % 3;
  if (p.kind == OtherRank) rank = seed & 1 ? 0 : 2, dims[0] = 1, dims[1] = static_cast<hsize_t>(n);
  const hid_t types[] = {H5T_IEEE_F64LE, H5T_IEEE_F32BE, H5T_STD_I32LE};
  const hid_t type = p.kind == OtherType ? types[seed % 3] : H5T_IEEE_F32LE;
  // Format 2 writes contiguous datasets, format 1 chunked ones with Fletcher-32;
  // OtherLayout is the other one (format 1 also without Fletcher-32).
  const bool chunked = legacy != (p.kind == OtherLayout);
  h5::Id space(rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims, nullptr), H5Sclose);
  h5::Id dcpl(BT_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
  if (p.kind == Compact) {
    BT_H5_CHECK(H5Pset_layout(dcpl, H5D_COMPACT));
  } else if (chunked && rank > 0) {
    p.chunk = std::min<int64_t>(1 + seed % 4, static_cast<int64_t>(rank == 1 ? dims[0] : dims[1]));
    const hsize_t chunk[2] = {rank == 1 ? static_cast<hsize_t>(p.chunk) : 1, static_cast<hsize_t>(p.chunk)};
    BT_H5_CHECK(H5Pset_chunk(dcpl, rank, chunk));
    if (p.kind != OtherLayout || (seed & 8)) BT_H5_CHECK(H5Pset_fletcher32(dcpl));
  } else if (p.kind != Unallocated) {
    BT_H5_CHECK(H5Pset_layout(dcpl, H5D_CONTIGUOUS));
    BT_H5_CHECK(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY));
    BT_H5_CHECK(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
  }
  h5::Id dset(H5Dcreate2(file, name.c_str(), type, space, lcpl, dcpl, H5P_DEFAULT), H5Dclose);
  if (dset.get() < 0) return 0;  // a name HDF5 refuses, or one taken: the piece has another's dataset or none
  p.made = true;
  if (p.kind == Unallocated) return 0;
  const size_t count = rank == 0 ? 1 : static_cast<size_t>(dims[0] * std::max<hsize_t>(dims[1], 1));
  std::vector<float> data(count);
  std::copy_n(p.truth.begin(), std::min(count, p.truth.size()), data.begin());
  BT_H5_CHECK(H5Dwrite(dset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()));
  if (p.flip_at < 0 || p.kind == Compact || rank != 1 || p.flip_at >= static_cast<int64_t>(count)) return 0;
  if (p.chunk == 0) {
    const haddr_t at = H5Dget_offset(dset);
    return at == HADDR_UNDEF ? 0 : at + static_cast<uint64_t>(p.flip_at) * 4 + p.flip_byte;
  }
  BT_H5_CHECK(H5Fflush(file, H5F_SCOPE_LOCAL));
  const hsize_t coord[1] = {static_cast<hsize_t>(p.flip_at / p.chunk * p.chunk)};
  unsigned mask = 0;
  haddr_t at = HADDR_UNDEF;
  hsize_t size = 0;
  if (H5Dget_chunk_info_by_coord(dset, coord, &mask, &at, &size) < 0 || at == HADDR_UNDEF) return 0;
  return at + static_cast<uint64_t>(p.flip_at % p.chunk) * 4 + p.flip_byte;
}

/// Whether reading range `r` reads the flipped element: format 2 reads the
/// crc32 blocks the range touches, format 1 the whole piece (Note [Partial
/// reads of format 1]).
bool touches_flip(const Piece& p, const Range& r) {
  if (p.flip_at < 0) return false;
  if (p.saved.block == 0) return true;
  const int64_t first = p.flip_at / p.saved.block * p.saved.block;  // the block, relative to begin
  return r.lo - p.saved.begin < first + p.saved.block && r.hi - p.saved.begin > first;
}

}  // namespace
}  // namespace bt::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace bt;
  using namespace bt::fuzz;
  static const bool once = keep_freed_memory() && small_thread_stacks();
  (void)once;
  Bytes in(data, size);
  const uint8_t flags = in.u8(), damage_byte = in.u8();
  const bool legacy = flags & 1, two_files = flags & 0x20, one_call_each = flags & 0x40;
  const int64_t block = 1 + (flags >> 1) % 16;
  enum Damage { None, Truncated, Gone, LinkOut, LinkIn } damage = None;
  if (damage_byte >= 0xc0) damage = static_cast<Damage>(1 + damage_byte % 4);

  const std::string dir = folder() + "/ckpt", out = folder() + "/elsewhere";
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::remove_all(out, ec);
  fs::create_directories(dir);
  fs::create_directories(out);
  const std::string files[2] = {"rank_00000.h5", "rank_00001.h5"};

  // The pieces, their index entries and their data.
  std::vector<Piece> pieces;
  std::vector<uint8_t> seeds;
  const size_t npieces = 1 + in.pick(6);
  for (size_t i = 0; i < npieces; ++i) {
    Piece p;
    const std::string tensor = in.choose(kTensors, 12);
    p.saved.begin = in.u8();
    p.saved.end = p.saved.begin + 1 + in.pick(48);
    const uint8_t seed = in.u8(), kind = in.u8(), flip_byte = in.u8();
    p.kind = kind_of(kind);
    p.saved.file = files[two_files ? i % 2 : 0];
    p.saved.dataset = tensor + "/" + std::to_string(p.saved.begin);
    const int64_t n = p.saved.end - p.saved.begin;
    p.truth = values(n, seed);
    p.saved.crc32 = ckpt::crc32_of(p.truth.data(), n);
    if (!legacy) {
      p.saved.block = block;
      for (int64_t b = 0; b < n; b += block)
        p.saved.block_crc32.push_back(ckpt::crc32_of(p.truth.data() + b, std::min(block, n - b)));
    }
    if (flip_byte != 0) {  // one bit: a crc32 and Fletcher-32 catch every such flip
      p.flip_at = (flip_byte >> 2) % n;
      p.flip_byte = flip_byte & 3;
      p.flip_mask = static_cast<uint8_t>(1u << (seed & 7));
    }
    try {  // what an index holds passes its reader
      (void)ckpt::piece_from_json(ckpt::piece_to_json(p.saved), "fuzz", tensor);
    } catch (const Error&) {
      __builtin_trap();
    }
    pieces.push_back(std::move(p));
    seeds.push_back(seed);
  }

  // The rank files.
  try {
    h5::Id lcpl(BT_H5_CHECK(H5Pcreate(H5P_LINK_CREATE)), H5Pclose);
    BT_H5_CHECK(H5Pset_create_intermediate_group(lcpl, 1));
    for (int f = 0; f < (two_files ? 2 : 1); ++f) {
      const std::string path = dir + "/" + files[f];
      std::vector<std::pair<uint64_t, uint8_t>> flips;
      {
        h5::Id file(BT_H5_CHECK(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)), H5Fclose);
        for (size_t i = 0; i < pieces.size(); ++i) {
          if (pieces[i].saved.file != files[f]) continue;
          const uint64_t at = write_piece(file, lcpl, pieces[i], legacy, seeds[i]);
          if (at == 0) pieces[i].flip_at = -1;
          if (at != 0) flips.emplace_back(at, pieces[i].flip_mask);
        }
        BT_H5_CHECK(H5Fclose(file.release()));
      }
      for (const auto& [at, mask] : flips) flip(path, at, mask);
    }
  } catch (const Error&) {  // HDF5 refused to write what the input describes
    return 0;
  }
  // Two pieces may name one dataset: it is the one the first of them made.
  std::map<std::pair<std::string, std::string>, const Piece*> owner;
  for (const Piece& p : pieces)
    if (p.made) owner.emplace(std::pair{p.saved.file, p.saved.dataset}, &p);
  auto owner_of = [&](const Piece& p) {
    const auto it = owner.find({p.saved.file, p.saved.dataset});
    return it == owner.end() ? nullptr : it->second;
  };

  const std::string first = dir + "/" + files[0];
  if (damage == Truncated) fs::resize_file(first, fs::file_size(first) * in.u8() / 256);
  if (damage == Gone) fs::remove(first);
  if (damage == LinkOut || damage == LinkIn) {
    const std::string to = damage == LinkOut ? out + "/" + files[0] : dir + "/real.h5";
    fs::rename(first, to);
    fs::create_symlink(to, first);
  }

  // The ranges to read: whole pieces, or parts.
  std::vector<Range> ranges;
  const size_t nranges = in.pick(8);
  for (size_t i = 0; i < (nranges == 0 ? pieces.size() : nranges); ++i) {
    const size_t k = nranges == 0 ? i : in.pick(pieces.size());
    const ckpt::SavedPiece& s = pieces[k].saved;
    Range r{k, s.begin, s.end};
    if (nranges != 0) {
      r.lo = s.begin + in.pick(static_cast<size_t>(s.end - s.begin));
      r.hi = r.lo + 1 + in.pick(static_cast<size_t>(s.end - r.lo));
    }
    ranges.push_back(r);
  }

  bool sound = true;  // a read that must be accepted: sound datasets holding the data intended, sound files
  for (const Range& r : ranges) {
    const Piece& p = pieces[r.piece];
    const Piece* o = owner_of(p);
    const bool damaged = p.saved.file == files[0] && damage != None && damage != LinkIn;
    sound = sound && o && o->kind == Sound && o->truth == p.truth && !touches_flip(*o, r) && !damaged;
  }

  std::vector<std::vector<float>> bufs;
  for (const Range& r : ranges) bufs.emplace_back(static_cast<size_t>(r.hi - r.lo), -7.0f);
  bool accepted = true;
  try {
    ckpt::ShardReader reader(dir);
    std::vector<ckpt::ShardReader::Range> todo;
    for (size_t i = 0; i < ranges.size(); ++i)
      todo.push_back({&pieces[ranges[i].piece].saved, ranges[i].lo, ranges[i].hi, bufs[i].data()});
    if (one_call_each) {
      for (const auto& t : todo) reader.read({t});
    } else {
      reader.read(todo);
    }
  } catch (const InternalError&) {
    __builtin_trap();
  } catch (const Error& err) {
    if (std::getenv("BT_FUZZ_VERBOSE")) std::fprintf(stderr, "refused: %s\n", err.what());
    accepted = false;
  }
  if (!accepted) {
    if (sound) __builtin_trap();
    return 0;
  }
  // Accepted: exactly the intended data, from no file outside the folder.
  if (damage == LinkOut && std::any_of(ranges.begin(), ranges.end(), [&](const Range& r) {
        return pieces[r.piece].saved.file == files[0];
      }))
    __builtin_trap();
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Range& r = ranges[i];
    const Piece& p = pieces[r.piece];
    if (owner_of(p) == nullptr || owner_of(p)->outside) __builtin_trap();
    if (std::memcmp(bufs[i].data(), p.truth.data() + (r.lo - p.saved.begin),
                    bufs[i].size() * sizeof(float)) != 0)
      __builtin_trap();
  }
  return 0;
}
