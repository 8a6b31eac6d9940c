#include "tests/support/error_message.h"

#include <gtest/gtest.h>

#include "kernels/common/error.h"

namespace bt::test {

std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a bt::Error";
  return "";
}

}  // namespace bt::test
