// BT_H5_CHECK turns a real HDF5 failure into bt::Error with HDF5's own text.
#include <cstdio>
#include <filesystem>

#include <gtest/gtest.h>

#include "checkpoint/h5_check.h"

namespace bt {
namespace {

TEST(H5Check, MissingFileIsAClearError) {
  detail::h5_silence_auto_errors();
  try {
    BT_H5_CHECK(H5Fopen("/nonexistent/dir/ckpt.h5", H5F_ACC_RDONLY, H5P_DEFAULT));
    FAIL() << "expected an HDF5 error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("HDF5 error"), std::string::npos) << m;
    EXPECT_NE(m.find("H5Fopen"), std::string::npos) << m;
    EXPECT_NE(m.find("test_h5_check.cpp:"), std::string::npos) << m;
  }
}

TEST(H5Check, SuccessPassesTheResultThrough) {
  const auto path = std::filesystem::temp_directory_path() / "bt_h5_check_test.h5";
  hid_t f = BT_H5_CHECK(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  EXPECT_GE(f, 0);
  BT_H5_CHECK(H5Fclose(f));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace bt
