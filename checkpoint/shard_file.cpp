#include "checkpoint/shard_file.h"

#include <algorithm>
#include <memory>
#include <thread>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>
#include <zlib.h>

#include "checkpoint/h5_check.h"
#include "checkpoint/h5_util.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/tensor/factory.h"

namespace bt::ckpt {
namespace {

constexpr hsize_t kChunk = hsize_t{1} << 20;  // elements (4 MiB) per HDF5 chunk

/// File-access properties: no file locking (Note [HDF5 file locking]).
h5::Id file_access() {
  h5::Id fapl(BT_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
  BT_H5_CHECK(H5Pset_file_locking(fapl, false, true));
  return fapl;
}

}  // namespace

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

namespace {

/// Writes all of `data` to a new file `path` and fsyncs it; on any failure
/// (ENOSPC included) removes the file and throws naming it.
struct Image {
  std::unique_ptr<char[]> data;
  size_t size = 0;
};

void write_bytes(const std::string& path, const Image& image) {
  const char* data = image.data.get();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  BT_CHECK(fd >= 0, "cannot create checkpoint file '", path, "': ", std::strerror(errno));
  size_t done = 0;
  int err = 0;
  while (done < image.size) {
    const ssize_t n = ::write(fd, data + done, image.size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    ::unlink(path.c_str());
    BT_FAIL("cannot write checkpoint file '", path, "' (", image.size, " bytes): ", std::strerror(err),
            err == ENOSPC ? " -- the disk is full; free space or point checkpoint.dir elsewhere" : "");
  }
}

}  // namespace

std::vector<std::pair<std::string, SavedPiece>> write_shard_file(
    const std::string& path, const std::string& file_name, const std::vector<dist::StatePiece>& pieces) {
  // Note [Checkpoint file image]: the file is built in memory by HDF5's core
  // driver and written with plain write(2) calls. A disk that fills up then
  // fails one of our writes, cleanly (HDF5 1.10 cannot recover from a failed
  // flush on close: the half-closed file crashes the library at exit), and
  // the data goes out as one sequential stream.
  detail::h5_silence_auto_errors();
  std::vector<std::pair<std::string, SavedPiece>> out;
  Image image;
  h5::with_context(cat("cannot build checkpoint file '", path, "'"), [&] {
    // One allocation for the whole image: the core driver grows by whole
    // increments, copying the image each time.
    size_t estimate = size_t{1} << 20;
    for (const dist::StatePiece& p : pieces) estimate += static_cast<size_t>(p.end - p.begin) * 4 + 4096;
    h5::Id fapl = file_access();
    BT_H5_CHECK(H5Pset_fapl_core(fapl, estimate, /*backing_store=*/false));
    h5::Id file(H5Fcreate(file_name.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), H5Fclose);
    BT_CHECK(file.get() >= 0, "cannot create checkpoint file '", path, "' in memory: ", h5::error_stack());
    h5::Id lcpl(BT_H5_CHECK(H5Pcreate(H5P_LINK_CREATE)), H5Pclose);
    BT_H5_CHECK(H5Pset_create_intermediate_group(lcpl, 1));
    NoGradGuard ng;
    std::vector<Tensor> host;
    for (const dist::StatePiece& p : pieces) {
      const int64_t n = p.end - p.begin;
      BT_CHECK(n > 0 && p.data.numel() == n, "checkpoint piece ", p.name, " [", p.begin, ", ", p.end,
               ") holds ", p.data.numel(), " elements");
      host.push_back(p.data.detach().to(Device::cpu()).to(DType::F32).contiguous());
    }
    // The crc32s on other cores while HDF5 writes (and Fletcher-32s) the data.
    const size_t lanes = std::max<size_t>(1, std::min<size_t>(8, std::thread::hardware_concurrency()));
    std::vector<uint32_t> crcs(pieces.size());
    std::vector<std::thread> workers;
    for (size_t w = 0; w < lanes; ++w)
      workers.emplace_back([&, w] {
        for (size_t i = w; i < host.size(); i += lanes) crcs[i] = crc32_of(host[i].data<float>(), host[i].numel());
      });
    struct Join {
      std::vector<std::thread>& t;
      ~Join() {
        for (auto& x : t)
          if (x.joinable()) x.join();
      }
    } join{workers};
    std::vector<std::string> names;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const dist::StatePiece& p = pieces[i];
      const std::string ds = cat(p.name, "/", p.begin);
      const hsize_t dims[1] = {static_cast<hsize_t>(p.end - p.begin)};
      // Equal chunks of at most kChunk elements: HDF5 stores an edge chunk at full size.
      const hsize_t nchunks = (dims[0] + kChunk - 1) / kChunk;
      const hsize_t chunk[1] = {(dims[0] + nchunks - 1) / nchunks};
      h5::Id space(BT_H5_CHECK(H5Screate_simple(1, dims, nullptr)), H5Sclose);
      h5::Id dcpl(BT_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
      BT_H5_CHECK(H5Pset_chunk(dcpl, 1, chunk));
      BT_H5_CHECK(H5Pset_fletcher32(dcpl));
      h5::Id dset(BT_H5_CHECK(H5Dcreate2(file, ds.c_str(), H5T_IEEE_F32LE, space, lcpl, dcpl, H5P_DEFAULT)),
                  H5Dclose);
      BT_H5_CHECK(H5Dwrite(dset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, host[i].data<float>()));
      h5::write_int_attr(dset, "begin", p.begin);
      h5::write_int_attr(dset, "end", p.end);
      names.push_back(ds);
    }
    for (auto& t : workers) t.join();
    for (size_t i = 0; i < pieces.size(); ++i) {
      h5::Id dset(BT_H5_CHECK(H5Dopen2(file, names[i].c_str(), H5P_DEFAULT)), H5Dclose);
      h5::write_int_attr(dset, "crc32", crcs[i]);
      out.emplace_back(pieces[i].name, SavedPiece{file_name, names[i], pieces[i].begin, pieces[i].end, crcs[i]});
    }
    BT_H5_CHECK(H5Fflush(file, H5F_SCOPE_GLOBAL));
    image.size = static_cast<size_t>(BT_H5_CHECK(H5Fget_file_image(file, nullptr, 0)));
    image.data.reset(new char[image.size]);  // not zeroed: H5Fget_file_image fills it
    BT_H5_CHECK(H5Fget_file_image(file, image.data.get(), image.size));
  });
  write_bytes(path, image);
  return out;
}

ShardReader::ShardReader(std::string dir) : dir_(std::move(dir)) { detail::h5_silence_auto_errors(); }

ShardReader::~ShardReader() {
  for (const auto& [name, id] : files_) H5Fclose(id);
}

int64_t ShardReader::file(const std::string& name) {
  auto it = files_.find(name);
  if (it != files_.end()) return it->second;
  const std::string path = dir_ + "/" + name;
  h5::Id fapl = file_access();
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
  BT_CHECK(f >= 0, "cannot open checkpoint file '", path, "': ", h5::error_stack(),
           " (missing, truncated or corrupt)");
  files_.emplace(name, f);
  return f;
}

void ShardReader::read(const SavedPiece& p, int64_t lo, int64_t hi, float* out) {
  BT_ASSERT(p.begin <= lo && lo < hi && hi <= p.end);
  const std::string where = cat("checkpoint file '", dir_, "/", p.file, "', dataset '", p.dataset, "'");
  const hid_t f = static_cast<hid_t>(file(p.file));
  h5::with_context(
      cat("cannot read ", where, " (corrupt: a checksum does not match, or the file is damaged)"), [&] {
        h5::Id dset(BT_H5_CHECK(H5Dopen2(f, p.dataset.c_str(), H5P_DEFAULT)), H5Dclose);
        h5::Id space(BT_H5_CHECK(H5Dget_space(dset)), H5Sclose);
        hsize_t dims[1] = {0};
        BT_CHECK(H5Sget_simple_extent_ndims(space) == 1, where, " is not 1-D");
        BT_H5_CHECK(H5Sget_simple_extent_dims(space, dims, nullptr));
        BT_CHECK(static_cast<int64_t>(dims[0]) == p.end - p.begin, where, " holds ", dims[0],
                 " elements but the index says ", p.end - p.begin, "; the checkpoint is corrupt");
        const hsize_t start[1] = {static_cast<hsize_t>(lo - p.begin)},
                      count[1] = {static_cast<hsize_t>(hi - lo)};
        BT_H5_CHECK(H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, count, nullptr));
        h5::Id mem(BT_H5_CHECK(H5Screate_simple(1, count, nullptr)), H5Sclose);
        BT_H5_CHECK(H5Dread(dset, H5T_NATIVE_FLOAT, mem, space, H5P_DEFAULT, out));
      });
  if (lo == p.begin && hi == p.end)
    BT_CHECK(crc32_of(out, hi - lo) == p.crc32, where,
             " does not match its crc32 in the index: the checkpoint is corrupt");
}

}  // namespace bt::ckpt
