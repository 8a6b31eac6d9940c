#include "checkpoint/posix_file.h"

#include <cerrno>
#include <cstring>
#include <limits>

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "kernels/common/error.h"

namespace bt::ckpt {
const char* full_disk_hint(int err) {
  return err == ENOSPC || err == EDQUOT ? " -- the disk is full; free space or point checkpoint.dir elsewhere"
                                        : "";
}

PosixFile::PosixFile(std::string path, Mode mode) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), (mode == Mode::Read ? O_RDONLY : O_WRONLY) | O_CLOEXEC);
  BT_CHECK(fd_ >= 0, "cannot open checkpoint file '", path_, "': ", std::strerror(errno));
}

PosixFile::~PosixFile() {
  if (fd_ >= 0) ::close(fd_);
}

void PosixFile::write_at(const void* data, size_t n, uint64_t offset) const {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      const int err = k < 0 ? errno : EIO;
      BT_FAIL("cannot write checkpoint file '", path_, "' (", n, " bytes at offset ", offset,
              "): ", std::strerror(err), full_disk_hint(err));
    }
    p += k;
    n -= static_cast<size_t>(k);
    offset += static_cast<uint64_t>(k);
  }
}

void PosixFile::read_at(void* data, size_t n, uint64_t offset) const {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t k = ::pread(fd_, p, n, static_cast<off_t>(offset));
    if (k < 0 && errno == EINTR) continue;
    BT_CHECK(k >= 0, "cannot read checkpoint file '", path_, "' at offset ", offset, ": ",
             std::strerror(errno));
    BT_CHECK(k > 0, "checkpoint file '", path_, "' ends at offset ", offset, " but its data goes on for ", n,
             " more bytes: it is truncated (the checkpoint is corrupt)");
    p += k;
    n -= static_cast<size_t>(k);
    offset += static_cast<uint64_t>(k);
  }
}

void PosixFile::reserve(uint64_t bytes) const {
#ifdef __linux__
  if (bytes == 0) return;
  int rc;
  do rc = ::fallocate(fd_, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(bytes));
  while (rc != 0 && errno == EINTR);
  if (rc == 0 || errno == EOPNOTSUPP || errno == ENOSYS) return;
  BT_FAIL("cannot reserve ", bytes, " bytes for checkpoint file '", path_, "': ", std::strerror(errno),
          full_disk_hint(errno));
#else
  (void)bytes;
#endif
}

void PosixFile::start_writeback(uint64_t offset, size_t n) const {
#ifdef __linux__
  ::sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(n), SYNC_FILE_RANGE_WRITE);
#else
  (void)offset;
  (void)n;
#endif
}

void PosixFile::sync_and_close() {
  int err = ::fsync(fd_) == 0 ? 0 : errno;
  if (::close(fd_) != 0 && err == 0) err = errno;
  fd_ = -1;
  BT_CHECK(err == 0, "cannot sync checkpoint file '", path_, "' to disk: ", std::strerror(err),
           full_disk_hint(err));
}

uint64_t free_bytes(const std::string& dir) {
  struct statvfs s {};
  if (::statvfs(dir.c_str(), &s) != 0) return std::numeric_limits<uint64_t>::max();
  return static_cast<uint64_t>(s.f_bavail) * s.f_frsize;
}

}  // namespace bt::ckpt
