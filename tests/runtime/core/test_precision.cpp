// The precision policy: its names both ways, the error for an unknown one,
// and that a setting is one for the whole process (every thread reads it).
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "runtime/core/precision.h"
#include "tests/support/error_message.h"

namespace bt {
namespace {

// Sets the precision for a scope and puts back what was there.
class PrecisionScope {
 public:
  explicit PrecisionScope(Precision p) : prev_(precision()) { set_precision(p); }
  ~PrecisionScope() { set_precision(prev_); }
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;

 private:
  Precision prev_;
};

TEST(Precision, StrictFloat32UntilSet) { EXPECT_EQ(precision(), Precision::FP32); }

TEST(Precision, NamesParseBack) {
  for (Precision p : {Precision::FP32, Precision::TF32, Precision::FP32X3, Precision::BF16})
    EXPECT_EQ(parse_precision(precision_name(p)), p) << precision_name(p);
  EXPECT_EQ(precision_name(Precision::FP32), "fp32");
  EXPECT_EQ(precision_name(Precision::TF32), "tf32");
  EXPECT_EQ(precision_name(Precision::FP32X3), "fp32x3");
  EXPECT_EQ(precision_name(Precision::BF16), "bf16");
}

TEST(Precision, AnUnknownNameIsAnErrorThatQuotesIt) {
  for (const std::string bad :
       {"FP32", "bf-16", "fp16", "float32", "", "bf16 ", "fp32x2", "3xtf32", "FP32X3"}) {
    const std::string msg = test::error_message([&] { (void)parse_precision(bad); });
    EXPECT_NE(msg.find("'" + bad + "'"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("use fp32, tf32, fp32x3 or bf16"), std::string::npos) << bad << ": " << msg;
  }
}

TEST(Precision, OneSettingForTheWholeProcess) {
  {
    PrecisionScope bf16(Precision::BF16);
    EXPECT_EQ(precision(), Precision::BF16);
    Precision seen = Precision::FP32;
    std::thread([&] { seen = precision(); }).join();
    EXPECT_EQ(seen, Precision::BF16) << "another thread sees the setting";
    std::thread([] { set_precision(Precision::TF32); }).join();
    EXPECT_EQ(precision(), Precision::TF32) << "a setting made on another thread holds here";
  }
  EXPECT_EQ(precision(), Precision::FP32);
}

}  // namespace
}  // namespace bt
