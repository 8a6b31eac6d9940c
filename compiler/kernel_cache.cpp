#include "compiler/kernel_cache.h"

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <zlib.h>

#include "kernels/common/error.h"

namespace bt::compiler {
namespace {

constexpr char kMagic[8] = {'B', 'T', 'K', 'E', 'R', 'N', 'E', 'L'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kFixedHeader = 8 + 4 + 4;  // magic, version, key length
constexpr size_t kPayloadHeader = 8 + 4;    // payload length, CRC32

void warn(const std::string& msg) { std::fprintf(stderr, "warning: %s\n", msg.c_str()); }

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t get_le(std::string_view in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(in[at + i])) << (8 * i);
  return v;
}

uint32_t crc32_of(std::string_view s) {
  uLong c = crc32(0L, Z_NULL, 0);
  // zlib takes lengths as uInt: feed it in pieces.
  for (size_t at = 0; at < s.size();) {
    const size_t n = std::min<size_t>(s.size() - at, 1u << 30);
    c = crc32(c, reinterpret_cast<const Bytef*>(s.data() + at), static_cast<uInt>(n));
    at += n;
  }
  return static_cast<uint32_t>(c);
}

std::string errno_text() { return std::strerror(errno); }

/// The file's bytes; nothing when it does not exist; `problem` set when it
/// exists and cannot be read.
std::optional<std::string> read_file(const std::string& path, std::string& problem) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT) problem = "unreadable (" + errno_text() + ")";
    return std::nullopt;
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      problem = "unreadable (" + errno_text() + ")";
      ::close(fd);
      return std::nullopt;
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

/// Writes `bytes` to a new file `path` (which must not exist); false with errno set on failure.
bool write_new_file(const std::string& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  for (size_t at = 0; at < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + at, bytes.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = n < 0 ? errno : EIO;
      ::close(fd);
      ::unlink(path.c_str());
      errno = e;
      return false;
    }
    at += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(path.c_str());
    errno = e;
    return false;
  }
  return true;
}

/// A name in the entry's folder no other writer uses: `path`.tmp.<pid>.<n>.
std::string temp_name(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return cat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
}

/// An entry's advisory lock (flock on DIR/<hex>.lock), held until destroyed.
class EntryLock {
 public:
  EntryLock(const std::string& path, double timeout_s) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      why_ = cat("cannot open it: ", errno_text());
      return;
    }
    // Polled, so that a lock never taken cannot hang the job: 1 ms, doubling to 50 ms.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
        held_ = true;
        return;
      }
      if (errno != EWOULDBLOCK && errno != EINTR) {
        why_ = cat("flock failed: ", errno_text());
        return;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        why_ = cat("another process held it for ", timeout_s, " s");
        return;
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
  }
  ~EntryLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  EntryLock(const EntryLock&) = delete;
  EntryLock& operator=(const EntryLock&) = delete;

  bool held() const { return held_; }
  const std::string& why_not() const { return why_; }

 private:
  int fd_ = -1;
  bool held_ = false;
  std::string why_;
};

/// Reads, verifies and loads the entry at `path` for `key`: true when `load`
/// took its payload; otherwise `problem` says what was wrong (nothing when
/// there is no entry).
bool load_entry(const std::string& path, const std::string& key,
                const std::function<void(const std::string&)>& load, std::string& problem) {
  const std::optional<std::string> bytes = read_file(path, problem);
  if (!bytes) return false;
  const std::optional<std::string> payload = decode_cache_entry(*bytes, key, problem);
  if (!payload) return false;
  try {
    load(*payload);
    return true;
  } catch (const std::exception& e) {
    problem = cat("unusable: its object code did not load: ", e.what());
    return false;
  }
}

}  // namespace

std::string kernel_cache_dir(const std::string& setting) {
  if (setting == "off") return "";
  if (!setting.empty()) return setting;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && xdg[0] == '/')
    return std::string(xdg) + "/blutrain/kernels";  // relative: ignored, as the spec says
  const char* home = std::getenv("HOME");
  if (home && home[0] != '\0') return std::string(home) + "/.cache/blutrain/kernels";
  warn(
      "compile.cache_dir: neither XDG_CACHE_HOME nor HOME is set, so there is no default kernel cache; "
      "fused kernels are compiled in memory only (set compile.cache_dir to a folder to keep them)");
  return "";
}

uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string encode_cache_entry(std::string_view key, std::string_view payload) {
  BT_ASSERT(key.size() <= UINT32_MAX, "kernel cache: a key of ", key.size(), " bytes");
  std::string out;
  out.reserve(kFixedHeader + key.size() + kPayloadHeader + payload.size());
  out.append(kMagic, sizeof kMagic);
  put_le(out, kFormatVersion, 4);
  put_le(out, key.size(), 4);
  out.append(key);
  put_le(out, payload.size(), 8);
  put_le(out, crc32_of(payload), 4);
  out.append(payload);
  return out;
}

std::optional<std::string> decode_cache_entry(std::string_view bytes, std::string_view key,
                                              std::string& problem) {
  const size_t size = bytes.size();
  if (size < sizeof kMagic || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    problem = "not a kernel cache entry (its first bytes are not the magic \"BTKERNEL\")";
    return std::nullopt;
  }
  if (size < kFixedHeader) {
    problem = cat("truncated: ", size, " bytes, shorter than the header");
    return std::nullopt;
  }
  const uint64_t version = get_le(bytes, 8, 4);
  if (version != kFormatVersion) {
    problem = cat("of format version ", version, " (this build reads version ", kFormatVersion, ")");
    return std::nullopt;
  }
  const uint64_t klen = get_le(bytes, 12, 4);
  if (size < kFixedHeader + klen + kPayloadHeader) {
    problem = cat("truncated: ", size, " bytes, shorter than its header with a key of ", klen, " bytes");
    return std::nullopt;
  }
  if (bytes.substr(kFixedHeader, klen) != key) {
    problem = "for another key (a hash collision or a stale entry: its header's key text differs)";
    return std::nullopt;
  }
  const size_t at = kFixedHeader + klen;
  const uint64_t plen = get_le(bytes, at, 8);
  const uint32_t crc = static_cast<uint32_t>(get_le(bytes, at + 8, 4));
  const size_t body = size - at - kPayloadHeader;
  if (body < plen) {
    problem = cat("truncated: its payload has ", body, " of ", plen, " bytes");
    return std::nullopt;
  }
  if (body > plen) {
    problem = cat("damaged: ", body - plen, " bytes follow its payload of ", plen);
    return std::nullopt;
  }
  std::string payload(bytes.substr(at + kPayloadHeader));
  if (const uint32_t got = crc32_of(payload); got != crc) {
    char buf[96];
    std::snprintf(buf, sizeof buf,
                  "damaged: its payload's CRC32 is %08" PRIx32 ", the header says %08" PRIx32, got, crc);
    problem = buf;
    return std::nullopt;
  }
  return payload;
}

KernelCache::KernelCache(std::string dir, double lock_timeout_s)
    : dir_(std::move(dir)), lock_timeout_s_(lock_timeout_s) {
  if (dir_.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  std::string why;
  if (ec) {
    why = ec.message();
  } else {
    const std::string probe = temp_name(dir_ + "/.probe");
    if (write_new_file(probe, "probe"))
      ::unlink(probe.c_str());
    else
      why = errno_text();
  }
  if (!why.empty()) {
    warn(cat("compile.cache_dir: cannot write to the kernel cache folder '", dir_, "' (", why,
             "); fused kernels are compiled in memory only"));
    return;
  }
  enabled_ = true;
}

std::string KernelCache::path_of(std::string_view key) const {
  char name[32];
  std::snprintf(name, sizeof name, "%016" PRIx64 ".btk", fnv1a64(key));
  return dir_ + "/" + name;
}

void KernelCache::write_entry(const std::string& path, const std::string& key, const std::string& payload) {
  const std::string tmp = temp_name(path);
  if (write_new_file(tmp, encode_cache_entry(key, payload)) && ::rename(tmp.c_str(), path.c_str()) == 0)
    return;
  const std::string why = errno_text();
  ::unlink(tmp.c_str());
  if (enabled_.exchange(false))
    warn(cat("cannot write the kernel cache entry ", path, " (", why,
             "); fused kernels are compiled in memory only from now on"));
}

KernelCache::Outcome KernelCache::fetch(const std::string& key,
                                        const std::function<void(const std::string&)>& load,
                                        const std::function<std::string()>& build) {
  if (!enabled()) {
    build();
    return Outcome::Compiled;
  }
  const std::string path = path_of(key);
  // A valid entry needs no lock: entries appear whole, by rename. Anything
  // else is looked at again under the lock, where it is reported.
  std::string problem;
  if (load_entry(path, key, load, problem)) return Outcome::Loaded;
  const EntryLock lock(path.substr(0, path.size() - 4) + ".lock", lock_timeout_s_);
  if (!lock.held()) {
    warn(cat("kernel cache: no lock on ", path, " (", lock.why_not(),
             "); compiling the kernel without the cache"));
    build();
    return Outcome::Uncached;
  }
  // The process that held the lock may have written the entry; a bad one is reported and replaced.
  problem.clear();
  if (load_entry(path, key, load, problem)) return Outcome::Loaded;
  if (!problem.empty()) {
    warn(cat("kernel cache entry ", path, " is ", problem, "; deleting it and compiling the kernel again"));
    ::unlink(path.c_str());
  }
  const std::string payload = build();
  write_entry(path, key, payload);
  return Outcome::Compiled;
}

}  // namespace bt::compiler
