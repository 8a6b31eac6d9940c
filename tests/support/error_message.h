// The message of the bt::Error a piece of code throws, for tests that check
// what an error says.
#pragma once

#include <functional>
#include <string>

namespace bt::test {

/// What `f` throws as a bt::Error; if it throws none, a test failure and "".
std::string error_message(const std::function<void()>& f);

}  // namespace bt::test
