// write_shard_file (Note [Checkpoint data path]).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>

#include <hdf5.h>
#include <zlib.h>

#include "checkpoint/h5_check.h"
#include "checkpoint/h5_util.h"
#include "checkpoint/posix_file.h"
#include "checkpoint/shard_file.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/core/stream.h"

namespace bt::ckpt {

namespace {

constexpr uint64_t kMetaPerPiece = 4096;  // HDF5 metadata bytes per dataset, generously

/// Where piece i's bytes go, and its checksums.
struct Slot {
  uint64_t offset = 0;
  int64_t n = 0;
  std::vector<uint32_t> crcs;  // per block
};

int64_t blocks_of(int64_t n) { return (n + kCrcBlock - 1) / kCrcBlock; }

/// File-access properties for writing: no locking (Note [HDF5 file locking]),
/// metadata gathered in blocks at the front, large datasets 4 KiB aligned.
h5::Id write_access(size_t pieces) {
  h5::Id fapl = unlocked_file_access();
  BT_H5_CHECK(H5Pset_fapl_sec2(fapl));
  BT_H5_CHECK(H5Pset_meta_block_size(fapl, std::clamp<hsize_t>(pieces * kMetaPerPiece, 4096, 4 << 20)));
  BT_H5_CHECK(H5Pset_alignment(fapl, 64 << 10, 4096));
  return fapl;
}

/// Creates piece `p`'s dataset with its space allocated and its attributes
/// (checksums zero, rewritten in place once known); returns its slot.
Slot create_dataset(hid_t file, hid_t lcpl, const dist::StatePiece& p, const std::string& name) {
  Slot s;
  s.n = p.end - p.begin;
  s.crcs.assign(static_cast<size_t>(blocks_of(s.n)), 0);
  const hsize_t dims[1] = {static_cast<hsize_t>(s.n)};
  h5::Id space(BT_H5_CHECK(H5Screate_simple(1, dims, nullptr)), H5Sclose);
  h5::Id dcpl(BT_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
  BT_H5_CHECK(H5Pset_layout(dcpl, H5D_CONTIGUOUS));
  BT_H5_CHECK(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY));
  BT_H5_CHECK(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
  h5::Id dset(BT_H5_CHECK(H5Dcreate2(file, name.c_str(), H5T_IEEE_F32LE, space, lcpl, dcpl, H5P_DEFAULT)),
              H5Dclose);
  h5::write_int_attr(dset, "begin", p.begin);
  h5::write_int_attr(dset, "end", p.end);
  h5::write_int_attr(dset, "crc32", 0);
  h5::write_int_attr(dset, "crc32_block", kCrcBlock);
  const hsize_t nb[1] = {s.crcs.size()};
  h5::Id bspace(BT_H5_CHECK(H5Screate_simple(1, nb, nullptr)), H5Sclose);
  h5::Id attr(BT_H5_CHECK(H5Acreate2(dset, "block_crc32", H5T_STD_U32LE, bspace, H5P_DEFAULT, H5P_DEFAULT)),
              H5Aclose);
  BT_H5_CHECK(H5Awrite(attr, H5T_NATIVE_UINT32, s.crcs.data()));
  const haddr_t at = H5Dget_offset(dset);
  BT_CHECK(at != HADDR_UNDEF, "HDF5 allocated no space for dataset '", name, "'");
  s.offset = at;
  return s;
}

void write_checksums(hid_t file, const std::string& name, const Slot& s, uint32_t whole) {
  h5::Id dset(BT_H5_CHECK(H5Dopen2(file, name.c_str(), H5P_DEFAULT)), H5Dclose);
  const int64_t crc = whole;
  h5::Id a(BT_H5_CHECK(H5Aopen(dset, "crc32", H5P_DEFAULT)), H5Aclose);
  BT_H5_CHECK(H5Awrite(a, H5T_NATIVE_INT64, &crc));
  h5::Id b(BT_H5_CHECK(H5Aopen(dset, "block_crc32", H5P_DEFAULT)), H5Aclose);
  BT_H5_CHECK(H5Awrite(b, H5T_NATIVE_UINT32, s.crcs.data()));
}

/// The crc32 of a piece from its blocks' (zlib's crc32_combine).
uint32_t combine(const std::vector<uint32_t>& crcs, int64_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (size_t b = 0; b < crcs.size(); ++b) {
    const int64_t len = std::min(kCrcBlock, n - static_cast<int64_t>(b) * kCrcBlock);
    crc = crc32_combine(crc, crcs[b], static_cast<z_off_t>(len * 4));
  }
  return static_cast<uint32_t>(crc);
}

/// Queues the blocks of one piece: each job checksums and writes one block.
/// CPU data is written where it lies; device data is first copied, a few
/// blocks at a time, into pinned host buffers the jobs hold.
void queue_piece(IoPool& pool, const PosixFile& out, const dist::StatePiece& p, Slot& s) {
  NoGradGuard ng;
  Tensor src = p.data.detach().reshape({-1});
  if (src.dtype() != DType::F32) src = src.to(DType::F32);
  src = src.contiguous();
  // Queues the blocks that `host` (elements [host_begin, ...) of the piece) holds.
  auto submit = [&](Tensor host, int64_t host_begin) {
    for (int64_t b = host_begin / kCrcBlock; b * kCrcBlock < host_begin + host.numel(); ++b) {
      const int64_t first = b * kCrcBlock, n = std::min(kCrcBlock, s.n - first);
      pool.submit([host, first, n, host_begin, &out, &s, b] {
        const float* data = host.data<float>() + (first - host_begin);
        s.crcs[static_cast<size_t>(b)] = crc32_of(data, n);
        const uint64_t at = s.offset + static_cast<uint64_t>(first) * 4;
        out.write_at(data, static_cast<size_t>(n) * 4, at);
        out.start_writeback(at, static_cast<size_t>(n) * 4);
      });
    }
  };
  if (src.device().is_cpu()) {
    submit(src, 0);
    return;
  }
  constexpr int64_t kStage = 8 * kCrcBlock;  // per device-to-host round
  for (int64_t lo = 0; lo < s.n; lo += kStage) {
    const int64_t len = std::min(kStage, s.n - lo);
    Tensor host = src.narrow(0, lo, len).to(Device::cpu(), /*non_blocking=*/true);  // pinned
    Stream::current(src.device()).synchronize();
    submit(host, lo);
  }
}

}  // namespace

std::vector<std::pair<std::string, SavedPiece>> write_shard_file(const std::string& path,
                                                                 const std::string& file_name,
                                                                 const std::vector<dist::StatePiece>& pieces,
                                                                 bool background) {
  detail::h5_silence_auto_errors();
  for (const dist::StatePiece& p : pieces)
    BT_CHECK(p.end > p.begin && p.data.numel() == p.end - p.begin, "checkpoint piece ", p.name, " [", p.begin,
             ", ", p.end, ") holds ", p.data.numel(), " elements");
  // HDF5 must never fail a metadata write (Note [Checkpoint data path]).
  const uint64_t meta = (pieces.size() + 16) * kMetaPerPiece;
  const uint64_t room = free_bytes(std::filesystem::path(path).parent_path().string());
  BT_CHECK(room >= meta, "cannot write checkpoint file '", path, "': ", room, " bytes free",
           full_disk_hint(ENOSPC));

  struct Remove {  // the file goes unless the save succeeds (after HDF5 closed it)
    const std::string& path;
    bool keep = false;
    ~Remove() {
      if (!keep) std::remove(path.c_str());
    }
  } remove{path};
  std::unique_ptr<h5::Id> file;
  std::vector<std::string> names;
  std::vector<Slot> slots;
  uint64_t eoa = 0;
  h5::with_context(cat("cannot create checkpoint file '", path, "'"), [&] {
    h5::Id fapl = write_access(pieces.size());
    file = std::make_unique<h5::Id>(BT_H5_CHECK(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl)),
                                    H5Fclose);
    h5::Id lcpl(BT_H5_CHECK(H5Pcreate(H5P_LINK_CREATE)), H5Pclose);
    BT_H5_CHECK(H5Pset_create_intermediate_group(lcpl, 1));
    for (const dist::StatePiece& p : pieces) {
      names.push_back(cat(p.name, "/", p.begin));
      slots.push_back(create_dataset(*file, lcpl, p, names.back()));
    }
    BT_H5_CHECK(H5Fflush(*file, H5F_SCOPE_GLOBAL));
    haddr_t a = 0;
    BT_H5_CHECK(H5Fget_eoa(*file, &a));
    eoa = a;
  });
  PosixFile out(path, PosixFile::Mode::Write);
  out.reserve(eoa);
  {
    IoPool pool(IoPool::default_threads(), 16, background);
    for (size_t i = 0; i < pieces.size(); ++i) queue_piece(pool, out, pieces[i], slots[i]);
    pool.wait();
  }
  std::vector<std::pair<std::string, SavedPiece>> result;
  h5::with_context(cat("cannot finish checkpoint file '", path, "'"), [&] {
    for (size_t i = 0; i < pieces.size(); ++i) {
      SavedPiece sp;
      sp.file = file_name;
      sp.dataset = names[i];
      sp.begin = pieces[i].begin;
      sp.end = pieces[i].end;
      sp.crc32 = combine(slots[i].crcs, slots[i].n);
      sp.block = kCrcBlock;
      sp.block_crc32 = slots[i].crcs;
      write_checksums(*file, names[i], slots[i], sp.crc32);
      result.emplace_back(pieces[i].name, std::move(sp));
    }
    BT_H5_CHECK(H5Fclose(file->release()));
  });
  out.sync_and_close();
  remove.keep = true;
  return result;
}

}  // namespace bt::ckpt
