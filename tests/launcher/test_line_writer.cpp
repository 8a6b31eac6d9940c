// LineWriter (Note [Log writes off the training thread]): lines come out in
// order and flushed by drain(); a failed write is reported by name.
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "launcher/line_writer.h"
#include "tests/support/error_message.h"
#include "tests/support/files.h"
#include "tests/support/temp_dir.h"

namespace bt::launcher {
namespace {

TEST(LineWriter, WritesEveryLineInOrderAndDrainFlushes) {
  test::TempDir dir("bt_lines");
  const std::string path = dir.file("log.txt");
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::string want;
  {
    LineWriter w(f, "the log");
    for (int i = 0; i < 2000; ++i) {
      const std::string line = "line " + std::to_string(i) + "\n";
      w.write(line);
      want += line;
    }
    w.drain();
    EXPECT_EQ(test::read_file(path), want) << "drain() returns once everything is in the file";
    w.write("last\n");
  }  // the destructor writes what is queued
  std::fclose(f);
  EXPECT_EQ(test::read_file(path), want + "last\n");
}

TEST(LineWriter, AFailedWriteIsReportedNamingTheFile) {
  FILE* f = std::fopen("/dev/full", "w");
  if (!f) GTEST_SKIP() << "no /dev/full";
  {
    LineWriter w(f, "the metrics file 'm.jsonl'");
    w.write("x\n");
    const std::string msg = test::error_message([&] { w.drain(); });
    EXPECT_NE(msg.find("cannot write the metrics file 'm.jsonl'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("the disk is full"), std::string::npos) << msg;
  }
  std::fclose(f);
}

TEST(LineWriter, ATerminalsErrorsAreIgnored) {
  FILE* f = std::fopen("/dev/full", "w");
  if (!f) GTEST_SKIP() << "no /dev/full";
  {
    LineWriter w(f, "");
    w.write("x\n");
    EXPECT_NO_THROW(w.drain());
  }
  std::fclose(f);
}

}  // namespace
}  // namespace bt::launcher
