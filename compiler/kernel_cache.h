// The on-disk kernel cache of the MLIR backend (compiler/mlir_backend.h):
// compiled kernels' object code in files, keyed by everything that changes the
// code, so that a job's second run -- and every rank after the first to ask --
// loads its kernels instead of compiling them. Plain C++ and POSIX, no LLVM:
// what an entry's payload holds is the caller's business (the object code
// compiler/cpu_jit.h makes and loads).
//
// Note [Kernel cache]
// One file per kernel, `DIR/<16 hex digits>.btk`, the digits the FNV-1a/64
// hash of the entry's key text (the backend's key: its code version, LLVM's
// version, the target triple, host CPU and features, the pipeline, the entry
// point, a hash of the emitted MLIR and the group's canonical text). The
// entry repeats the whole key text in its header, so a hash collision or a
// stale entry is a mismatch, not a wrong kernel. An entry (integers little-endian):
//   magic "BTKERNEL" (8 bytes) | format version u32 | key length K u32 |
//   key text (K bytes) | payload length P u64 | CRC32 (zlib) of the payload u32 |
//   payload (P bytes)
// and nothing after it. An entry is written to a temporary file in the same
// folder and renamed over its name, so readers see a whole entry or none, and
// concurrent writers of one entry are harmless (the last rename wins; both
// wrote the same kernel). Nothing is fsynced: what a crash leaves is caught by
// the checks below.
// Reading checks everything: the magic, the version, the lengths against the
// file's size, the key text, the CRC; then the caller loads the payload (a
// load that fails is one more problem). Any problem is one warning naming the
// file and what was wrong; the entry is deleted, the kernel compiled and the
// entry written again. An unverified entry is never handed to the caller.
// Processes (ranks) share the folder: a miss takes the entry's advisory lock,
// `DIR/<hex>.lock` (flock(2), polled), reads the entry again -- the process
// that held the lock may just have written it -- and only then compiles and
// writes. So the first process to take an entry's lock compiles that kernel
// and the others wait and load it: one compile per kernel per job, by
// whichever rank reaches the kernel first (not necessarily rank 0; the rank
// is not known here, and need not be).
// A lock not taken within the timeout (120 s) is warned about and the kernel
// is compiled without the cache. Lock files stay (deleting one would let two
// processes lock different files of the same name).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace bt::compiler {

/// Bump when the code a group compiles to changes while its key text would
/// not: CpuModule's code generation (compiler/cpu_jit.cpp), or the meaning of
/// a pass kCpuPipeline names. (The emitted MLIR and the pipeline's text are in
/// the key already; bumping for them too costs one recompile.)
constexpr int kKernelCodeVersion = 1;

/// The folder compile.cache_dir names: "" -> $XDG_CACHE_HOME/blutrain/kernels,
/// else $HOME/.cache/blutrain/kernels (neither set: a warning, and none);
/// "off" -> "" (no disk cache); anything else as given.
std::string kernel_cache_dir(const std::string& setting);

/// FNV-1a, 64 bits.
uint64_t fnv1a64(std::string_view s);

/// The bytes of an entry holding `payload` for `key` (Note [Kernel cache]).
std::string encode_cache_entry(std::string_view key, std::string_view payload);

/// The payload of `bytes` when they are a valid entry for `key`; otherwise
/// nothing, and `problem` says what is wrong ("truncated: ...").
std::optional<std::string> decode_cache_entry(std::string_view bytes, std::string_view key,
                                              std::string& problem);

class KernelCache {
 public:
  /// `dir` empty: no disk cache. Otherwise the folder is created and a file
  /// written there and removed; when that fails, one warning (stderr) and no
  /// disk cache.
  explicit KernelCache(std::string dir, double lock_timeout_s = 120.0);

  bool enabled() const { return enabled_.load(); }
  const std::string& dir() const { return dir_; }
  /// The entry file of `key`.
  std::string path_of(std::string_view key) const;

  enum class Outcome {
    Loaded,    // a verified entry's payload went to `load`
    Compiled,  // `build` ran and its payload was written (or the cache is off)
    Uncached,  // `build` ran, nothing written: the entry's lock was not taken in time
  };
  /// The kernel of `key`: a verified entry's payload through `load` (which
  /// throws when it cannot use it: the entry is then reported, deleted and
  /// rebuilt); else `build()`, which compiles the kernel and returns the
  /// payload to store, under the entry's lock (Note [Kernel cache]). What
  /// `build` throws propagates, and nothing is written.
  Outcome fetch(const std::string& key, const std::function<void(const std::string& payload)>& load,
                const std::function<std::string()>& build);

 private:
  void write_entry(const std::string& path, const std::string& key, const std::string& payload);

  std::string dir_;
  double lock_timeout_s_;
  std::atomic<bool> enabled_{false};  // off after a failed write, too
};

}  // namespace bt::compiler
