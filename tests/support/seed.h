// Seeds for tests that draw fresh random data every run (the GPU tests): each
// run tries new values, a failure prints the seed and the command that
// replays it, and BT_TEST_SEED=N replays it. Header-only, so the kernel tests
// (which link only libbt_kernels) use it too.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>

#include <gtest/gtest.h>

namespace bt::test {

/// BT_TEST_SEED when it is set (to replay a failure: the seed the failure
/// printed), else a fresh random seed.
inline uint64_t test_seed() {
  const char* env = std::getenv("BT_TEST_SEED");
  if (env == nullptr || *env == '\0') return std::random_device{}();
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(env, &end, 10);
  if (*env < '0' || *env > '9' || *end != '\0' || errno == ERANGE)
    throw std::invalid_argument(std::string("BT_TEST_SEED='") + env +
                                "' is not a seed: set it to the decimal number a failed test printed "
                                "(\"seed N\"), or unset it for fresh seeds");
  return v;
}

/// "seed N (replay: BT_TEST_SEED=N <this binary> --gtest_filter=<this test>)".
inline std::string replay_hint(uint64_t seed) {
  std::error_code ec;
  std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) exe = "<test binary>";
  const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string filter = t ? std::string(t->test_suite_name()) + "." + t->name() : "<test>";
  const std::string s = std::to_string(seed);
  return "seed " + s + " (replay: BT_TEST_SEED=" + s + " " + exe + " --gtest_filter='" + filter + "')";
}

}  // namespace bt::test

/// Declares `const uint64_t name`, this test's seed (bt::test::test_seed()),
/// and a SCOPED_TRACE naming it with its replay command, so that every failure
/// in the rest of the scope prints both.
#define BT_SEED(name)                            \
  const uint64_t name = ::bt::test::test_seed(); \
  SCOPED_TRACE(::bt::test::replay_hint(name))
