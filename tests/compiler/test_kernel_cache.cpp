// The on-disk kernel cache (compiler/kernel_cache.h, Note [Kernel cache]):
// a kernel compiled by one backend is loaded by the next from the same
// folder, giving the same bits; every kind of damaged entry is reported,
// rebuilt and never run; `off` writes nothing; an unwritable folder warns and
// still computes; two processes racing on one entry compile it once; a lock
// held too long is warned about and bypassed; the entry format by itself.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include "compiler/kernel_cache.h"
#include "compiler/mlir_backend.h"
#include "runtime/compile/fusion_backend.h"
#include "runtime/tensor/factory.h"
#include "tests/support/files.h"
#include "tests/support/fusion_groups.h"
#include "tests/support/temp_dir.h"

namespace bt {
namespace {

using compiler::KernelCache;
namespace fs = std::filesystem;

std::shared_ptr<fusion::Backend> backend_in(const std::string& dir) {
  compiler::BackendOptions o;
  o.cache_dir = dir;
  return compiler::make_mlir_backend(o);
}

/// A group's kernel run on fixed inputs.
struct Outputs {
  std::vector<Tensor> out;
  bool loaded = false;
};

/// The test's group (LayerNorm from primitives: row reductions and broadcasts) and its inputs.
struct Work {
  fusion::Group g = test::layer_norm_group(DType::F32, 24, 96);
  std::vector<Tensor> inputs;
  Work() {
    std::mt19937 gen(11);
    inputs = {test::uniform_cpu({24, 96}, DType::F32, gen), test::uniform_cpu({96}, DType::F32, gen),
              test::uniform_cpu({96}, DType::F32, gen)};
  }
  Outputs run(fusion::Backend& b) const {
    Outputs r;
    const std::shared_ptr<fusion::Kernel> k = b.compile(g, Device::cpu());
    for (int o : g.outputs) {
      r.out.push_back(empty(g.nodes[o].shape, TensorOptions{g.nodes[o].dtype}));
      r.out.back().fill_(std::nan(""));
    }
    k->run(inputs, r.out);
    r.loaded = k->loaded_from_cache();
    return r;
  }
};

/// Bit-for-bit equality of two runs' outputs, and both within 1e-6 of run_eager.
void expect_same_bits_and_eager(const Work& w, const Outputs& a, const Outputs& b) {
  const std::vector<Tensor> want = fusion::run_eager(w.g, w.inputs);
  ASSERT_EQ(a.out.size(), b.out.size());
  for (size_t i = 0; i < a.out.size(); ++i) {
    EXPECT_EQ(fusion::relative_difference(a.out[i], b.out[i]), 0.0) << "output " << i;
    EXPECT_EQ(std::memcmp(a.out[i].data_ptr(), b.out[i].data_ptr(), a.out[i].nbytes()), 0) << "output " << i;
    EXPECT_LT(fusion::relative_difference(b.out[i], want[i]), 1e-6) << "output " << i;
  }
}

/// The cache entries (*.btk) in `dir`.
std::vector<fs::path> entries(const fs::path& dir) {
  std::vector<fs::path> e;
  if (!fs::exists(dir)) return e;
  for (const auto& f : fs::directory_iterator(dir))
    if (f.path().extension() == ".btk") e.push_back(f.path());
  return e;
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << bytes;
  ASSERT_TRUE(f.good()) << p;
}

/// `s` with the bits `mask` of byte `at` flipped.
std::string flipped(std::string s, size_t at, int mask) {
  s.replace(at, 1, 1, static_cast<char>(s.at(at) ^ mask));
  return s;
}

TEST(KernelCache, ASecondBackendLoadsWhatTheFirstCompiled) {
  test::TempDir dir("bt_kernel_cache");
  const Work w;
  const std::shared_ptr<fusion::Backend> first = backend_in(dir.path().string());
  ASSERT_TRUE(first);
  EXPECT_EQ(first->describe(), "mlir backend, kernel cache in " + dir.path().string());
  const Outputs a = w.run(*first);
  EXPECT_FALSE(a.loaded) << "an empty folder has nothing to load";
  ASSERT_EQ(entries(dir.path()).size(), 1u);
  const Outputs b = w.run(*backend_in(dir.path().string()));
  EXPECT_TRUE(b.loaded) << "a fresh backend on the same folder loads the entry";
  expect_same_bits_and_eager(w, a, b);
  EXPECT_EQ(entries(dir.path()).size(), 1u);
  // Another shape is another key, so another entry; the first is still loaded.
  Work other;
  other.g = test::layer_norm_group(DType::F32, 5, 96);
  other.inputs[0] = other.inputs[0].slice(0, 0, 5);
  EXPECT_FALSE(other.run(*backend_in(dir.path().string())).loaded);
  EXPECT_EQ(entries(dir.path()).size(), 2u);
  EXPECT_TRUE(w.run(*backend_in(dir.path().string())).loaded);
}

TEST(KernelCache, DamagedEntriesAreReportedRebuiltAndNeverRun) {
  test::TempDir dir("bt_kernel_cache");
  const Work w;
  const Outputs good = w.run(*backend_in(dir.path().string()));
  ASSERT_EQ(entries(dir.path()).size(), 1u);
  const fs::path entry = entries(dir.path())[0];
  const std::string valid = test::read_file(entry.string());
  ASSERT_GT(valid.size(), 1000u);
  struct Damage {
    const char* what;
    std::function<std::string(const std::string&)> apply;
    const char* says;
  };
  const std::vector<Damage> damages = {
      {"a flipped byte in the payload", [](const std::string& s) { return flipped(s, s.size() - 200, 0x10); },
       "is damaged: its payload's CRC32 is"},
      {"a truncated file", [](const std::string& s) { return s.substr(0, s.size() / 2); },
       "is truncated: its payload has"},
      {"a file cut inside its header", [](const std::string& s) { return s.substr(0, 10); },
       "is truncated: 10 bytes, shorter than the header"},
      {"bytes after the payload", [](const std::string& s) { return s + "extra"; },
       "is damaged: 5 bytes follow"},
      {"a wrong key text in the header",
       [](const std::string& s) { return flipped(s, 16 + 3, 0x01); },  // the key text starts at byte 16
       "is for another key"},
      {"another format version", [](const std::string& s) { return flipped(s, 8, 0x03); },  // 1 -> 2
       "is of format version 2"},
      {"garbage", [](const std::string&) { return std::string("not an entry at all\n"); },
       "is not a kernel cache entry"},
  };
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.what);
    write_bytes(entry, d.apply(valid));
    ::testing::internal::CaptureStderr();
    const Outputs r = w.run(*backend_in(dir.path().string()));
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("warning: kernel cache entry " + entry.string() + " " + d.says), std::string::npos)
        << err;
    EXPECT_NE(err.find("; deleting it and compiling the kernel again"), std::string::npos) << err;
    EXPECT_FALSE(r.loaded) << "a damaged entry is never run";
    expect_same_bits_and_eager(w, good, r);
    // Rewritten whole: the same object code again, and the next backend loads it.
    EXPECT_EQ(test::read_file(entry.string()), valid);
    EXPECT_TRUE(w.run(*backend_in(dir.path().string())).loaded);
  }
  EXPECT_EQ(entries(dir.path()).size(), 1u);
}

TEST(KernelCache, OffWritesNothing) {
  test::TempDir dir("bt_kernel_cache");
  const char* old = std::getenv("XDG_CACHE_HOME");
  const std::optional<std::string> saved = old ? std::optional<std::string>(old) : std::nullopt;
  ::setenv("XDG_CACHE_HOME", dir.path().c_str(), 1);
  EXPECT_EQ(compiler::kernel_cache_dir(""), dir.path().string() + "/blutrain/kernels");
  EXPECT_EQ(compiler::kernel_cache_dir("/some/where"), "/some/where");
  EXPECT_EQ(compiler::kernel_cache_dir("off"), "");
  const std::shared_ptr<fusion::Backend> b = backend_in(compiler::kernel_cache_dir("off"));
  if (saved)
    ::setenv("XDG_CACHE_HOME", saved->c_str(), 1);
  else
    ::unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(b->describe(), "mlir backend, kernel cache off");
  const Work w;
  const Outputs a = w.run(*b), c = w.run(*b);
  EXPECT_FALSE(a.loaded);
  EXPECT_FALSE(c.loaded);
  EXPECT_TRUE(fs::is_empty(dir.path())) << "compile.cache_dir=off wrote something";
}

TEST(KernelCache, AnUnwritableFolderWarnsOnceAndStillComputes) {
  test::TempDir dir("bt_kernel_cache");
  write_bytes(dir.path() / "file", "a file where the folder would go");
  const std::string bad = (dir.path() / "file" / "kernels").string();  // unwritable, even for root
  ::testing::internal::CaptureStderr();
  const std::shared_ptr<fusion::Backend> b = backend_in(bad);
  const Work w;
  const Outputs a = w.run(*b), c = w.run(*b);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("warning: compile.cache_dir: cannot write to the kernel cache folder '" + bad + "'"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("fused kernels are compiled in memory only"), std::string::npos) << err;
  EXPECT_EQ(err.find("warning", err.find("warning") + 1), std::string::npos) << "one warning: " << err;
  EXPECT_EQ(b->describe(), "mlir backend, kernel cache off");
  EXPECT_FALSE(a.loaded);
  expect_same_bits_and_eager(w, a, c);
}

TEST(KernelCache, TwoProcessesRacingOnOneEntryCompileItOnce) {
  // Two processes released together ask for the same kernel: one takes the
  // entry's lock and compiles, the other waits and loads what it wrote.
  test::TempDir dir("bt_kernel_cache");
  const Work w;
  const std::vector<Tensor> want = fusion::run_eager(w.g, w.inputs);
  int gate[2];
  ASSERT_EQ(::pipe(gate), 0);
  std::vector<pid_t> kids;
  for (int i = 0; i < 2; ++i) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // the child: exit 0 loaded, 1 compiled, 2 wrong values, 3 an error
      int code = 3;
      try {
        ::close(gate[1]);
        char c;
        (void)!::read(gate[0], &c, 1);  // returns when the parent closes its end
        const Outputs r = w.run(*backend_in(dir.path().string()));
        code = r.loaded ? 0 : 1;
        for (size_t k = 0; k < r.out.size(); ++k)
          if (!(fusion::relative_difference(r.out[k], want[k]) < 1e-6)) code = 2;
      } catch (...) {
      }
      ::_exit(code);
    }
    kids.push_back(pid);
  }
  ::close(gate[0]);
  ::close(gate[1]);  // go
  int loaded = 0, compiled = 0;
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    const int code = WEXITSTATUS(status);
    ASSERT_LE(code, 1) << (code == 2 ? "a child computed wrong values" : "a child failed");
    (code == 0 ? loaded : compiled)++;
  }
  EXPECT_EQ(compiled, 1);
  EXPECT_EQ(loaded, 1);
  EXPECT_EQ(entries(dir.path()).size(), 1u);
  EXPECT_TRUE(w.run(*backend_in(dir.path().string())).loaded);
}

// The cache alone, with stand-in payloads: what fetch does with each outcome.

TEST(KernelCache, ALockHeldTooLongIsWarnedAboutAndBypassed) {
  test::TempDir dir("bt_kernel_cache");
  KernelCache cache(dir.path().string(), /*lock_timeout_s=*/0.2);
  const std::string entry = cache.path_of("key");
  const std::string lock = entry.substr(0, entry.size() - 4) + ".lock";
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);  // another process compiling, forever
  int builds = 0;
  ::testing::internal::CaptureStderr();
  const KernelCache::Outcome got = cache.fetch(
      "key", [](const std::string&) { FAIL() << "nothing to load"; },
      [&] {
        ++builds;
        return std::string("object");
      });
  const std::string err = ::testing::internal::GetCapturedStderr();
  ::close(fd);
  EXPECT_EQ(got, KernelCache::Outcome::Uncached);
  EXPECT_EQ(builds, 1);
  EXPECT_NE(err.find("warning: kernel cache: no lock on " + entry), std::string::npos) << err;
  EXPECT_NE(err.find("compiling the kernel without the cache"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(entry)) << "nothing is written without the lock";
}

TEST(KernelCache, AnEntryThatDoesNotLoadIsReplaced) {
  test::TempDir dir("bt_kernel_cache");
  KernelCache cache(dir.path().string());
  const auto build = [](const char* what) { return [what] { return std::string(what); }; };
  std::string got;
  const auto keep = [&](const std::string& p) { got = p; };
  EXPECT_EQ(cache.fetch("key", keep, build("first")), KernelCache::Outcome::Compiled);
  EXPECT_EQ(cache.fetch("key", keep, build("unused")), KernelCache::Outcome::Loaded);
  EXPECT_EQ(got, "first");
  ::testing::internal::CaptureStderr();
  const KernelCache::Outcome o = cache.fetch(
      "key", [](const std::string&) -> void { throw std::runtime_error("no such symbol"); }, build("second"));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(o, KernelCache::Outcome::Compiled);
  EXPECT_NE(err.find("is unusable: its object code did not load: no such symbol"), std::string::npos) << err;
  EXPECT_EQ(cache.fetch("key", keep, build("unused")), KernelCache::Outcome::Loaded);
  EXPECT_EQ(got, "second");
}

TEST(KernelCache, TheEntryFormat) {
  const std::string e = compiler::encode_cache_entry("the key", std::string("pay\0load", 8));
  ASSERT_EQ(e.size(), 8 + 4 + 4 + 7 + 8 + 4 + 8u);
  EXPECT_EQ(e.substr(0, 8), "BTKERNEL");
  EXPECT_EQ(e.substr(16, 7), "the key");
  std::string problem;
  const std::optional<std::string> p = compiler::decode_cache_entry(e, "the key", problem);
  ASSERT_TRUE(p) << problem;
  EXPECT_EQ(*p, std::string("pay\0load", 8));
  EXPECT_FALSE(compiler::decode_cache_entry(e, "the kez", problem));
  EXPECT_NE(problem.find("for another key"), std::string::npos) << problem;
  EXPECT_FALSE(compiler::decode_cache_entry("", "the key", problem));
  EXPECT_NE(problem.find("not a kernel cache entry"), std::string::npos) << problem;
  // The file name is the key's FNV-1a/64 (its reference values).
  EXPECT_EQ(compiler::fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(compiler::fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(KernelCache("").path_of("a"), "/af63dc4c8601ec8c.btk");
  EXPECT_FALSE(KernelCache("").enabled());
}

}  // namespace
}  // namespace bt
