// The BT_PROFILE scopes: time and calls accumulate per scope, nested scopes
// are recorded under "outer/inner" (per thread), shares are of the top-level
// total, and profile_reset() empties the table. Profiling is switched on for
// this whole executable below, before anything reads BT_PROFILE (it is read
// once).
#include <chrono>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "runtime/core/profiler.h"

namespace bt {
namespace {

const bool kProfiling = [] { return setenv("BT_PROFILE", "1", 1) == 0; }();

struct Row {
  double ms = 0;
  int64_t calls = 0;
  double share = 0;  // percent
};

// profile_report() as scope -> row, and the scopes in the order printed.
std::map<std::string, Row> parse(const std::string& report, std::vector<std::string>* order = nullptr) {
  std::istringstream in(report);
  std::string line;
  std::getline(in, line);  // the header
  EXPECT_EQ(line.rfind("scope", 0), 0u) << report;
  std::map<std::string, Row> rows;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string name, share;
    Row r;
    f >> name >> r.ms >> r.calls >> share;
    EXPECT_TRUE(f && share.back() == '%') << "a malformed row: " << line;
    r.share = std::stod(share);
    EXPECT_TRUE(rows.emplace(name, r).second) << "scope " << name << " printed twice";
    if (order) order->push_back(name);
  }
  return rows;
}

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

class Profiler : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(kProfiling);
    ASSERT_TRUE(profiling_enabled());
    profile_reset();
  }
};

TEST_F(Profiler, AccumulatesTimeAndCallsPerScope) {
  for (int i = 0; i < 3; ++i) {
    ProfileScope step("step");
    {
      ProfileScope fwd("forward");
      sleep_ms(5);
    }
    ProfileScope bwd(std::string("backward"));
    sleep_ms(2);
  }
  std::vector<std::string> order;
  const auto rows = parse(profile_report(), &order);
  ASSERT_EQ(rows.size(), 3u) << profile_report();
  const Row &step = rows.at("step"), &fwd = rows.at("step/forward"), &bwd = rows.at("step/backward");
  EXPECT_EQ(step.calls, 3);
  EXPECT_EQ(fwd.calls, 3);
  EXPECT_EQ(bwd.calls, 3);
  // sleep_for sleeps at least as long as asked: lower bounds only.
  EXPECT_GE(fwd.ms, 15.0);
  EXPECT_GE(bwd.ms, 6.0);
  EXPECT_GE(step.ms, fwd.ms + bwd.ms - 1e-6);  // the children run inside it
  // Shares are of the top-level total: "step" is all of it.
  EXPECT_DOUBLE_EQ(step.share, 100.0);
  EXPECT_LE(fwd.share, 100.0);
  EXPECT_EQ(order.front(), "step") << "largest first";
}

TEST_F(Profiler, NestingUnwindsAndIsPerThread) {
  {
    ProfileScope a("a");
    { ProfileScope b("b"); }
    { ProfileScope c("c"); }  // a sibling of b, not inside it
    std::thread([] { ProfileScope w("worker"); }).join();
  }
  { ProfileScope d("d"); }  // top level again
  const auto rows = parse(profile_report());
  for (const char* name : {"a", "a/b", "a/c", "worker", "d"})
    EXPECT_EQ(rows.count(name), 1u) << name << " missing from\n" << profile_report();
  EXPECT_EQ(rows.size(), 5u) << profile_report();
}

TEST_F(Profiler, ResetEmptiesTheTable) {
  { ProfileScope s("once"); }
  EXPECT_EQ(parse(profile_report()).size(), 1u);
  profile_reset();
  EXPECT_TRUE(parse(profile_report()).empty()) << profile_report();
  { ProfileScope s("once"); }
  EXPECT_EQ(parse(profile_report()).at("once").calls, 1) << "counts start again from zero";
}

}  // namespace
}  // namespace bt
