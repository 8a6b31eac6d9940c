// Tests that use data fetched by scripts/fetch-data (or node): where it is, and
// what to do when it is missing. They skip, unless BT_REQUIRE_DATA=1 (set by
// scripts/test, which fetches the data first), in which case they fail. Other
// BT_REQUIRE_* switches (required()) do the same for what a test needs of the
// machine: BT_REQUIRE_TMPFS (scripts/test sets it where a tmpfs mounts) and
// BT_REQUIRE_SLURM (where it starts its Slurm cluster).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "tests/support/paths.h"

namespace bt::test {

/// The fetched-data folder: $DATA_DIR when set (as for scripts/fetch-data),
/// else data/ at the repository root.
inline std::string data_dir() {
  if (const char* d = std::getenv("DATA_DIR"); d && *d) return d;
  return source_dir() + "/data";
}

/// True when the environment variable `name` (a BT_REQUIRE_* switch) is set
/// to anything but "" or "0".
inline bool required(const char* name) {
  const char* r = std::getenv(name);
  return r && *r && std::string(r) != "0";
}

/// True when BT_REQUIRE_DATA is set to anything but "" or "0".
inline bool data_required() { return required("BT_REQUIRE_DATA"); }

/// True when `node` runs.
inline bool node_available() { return std::system("node --version >/dev/null 2>&1") == 0; }

}  // namespace bt::test

/// In a test body or SetUp(): skips the test when `cond` is false, or fails
/// it under BT_REQUIRE_DATA=1. `what` says what is missing and how to get it.
#define BT_NEED(cond, what)                                                           \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      if (::bt::test::data_required()) FAIL() << what << " (BT_REQUIRE_DATA=1)";      \
      GTEST_SKIP() << what << " (set BT_REQUIRE_DATA=1 to fail instead of skipping)"; \
    }                                                                                 \
  } while (0)

/// BT_NEED for a file that `scripts/fetch-data NAME` provides.
#define BT_NEED_FETCHED(path, name) \
  BT_NEED(std::filesystem::exists(path), (path) << " is missing; run `scripts/fetch-data " << (name) << "`")
