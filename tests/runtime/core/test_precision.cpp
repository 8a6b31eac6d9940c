// The precision policy: its names both ways, the error for an unknown one,
// that a setting is one for the whole process (every thread reads it), and
// how each precision multiplies f32 matrices.
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

TEST(Precision, HowEachPrecisionMultipliesF32Matrices) {
  using kernels::GemmMath;
  EXPECT_EQ(matmul_math(Precision::FP32), GemmMath::Strict);
  EXPECT_EQ(matmul_math(Precision::TF32), GemmMath::Tf32);
  EXPECT_EQ(matmul_math(Precision::FP32X3), GemmMath::Tf32x3);
  EXPECT_EQ(matmul_math(Precision::BF16), GemmMath::Strict);  // what bf16 leaves in f32 stays strict
  // Attention: tf32's on the TF32 tensor cores, every other precision strict
  // (fp32x3's 3xTF32 attention is no faster than strict); BT_ATTENTION_MATH
  // strict or matmul overrides that.
  for (Precision p : {Precision::FP32, Precision::TF32, Precision::FP32X3, Precision::BF16}) {
    const GemmMath want = p == Precision::TF32 ? GemmMath::Tf32 : GemmMath::Strict;
    EXPECT_EQ(attention_math(p, ""), want) << precision_name(p);
    EXPECT_EQ(attention_math(p, "auto"), want) << precision_name(p);
    EXPECT_EQ(attention_math(p, "strict"), GemmMath::Strict) << precision_name(p);
    EXPECT_EQ(attention_math(p, "matmul"), matmul_math(p)) << precision_name(p);
  }
  for (const std::string bad : {"Matmul", "tf32", " strict", "1", "AUTO"}) {
    const std::string msg = test::error_message([&] { (void)attention_math(Precision::TF32, bad); });
    EXPECT_NE(msg.find("BT_ATTENTION_MATH='" + bad + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("use auto (the default), strict or matmul"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace bt
