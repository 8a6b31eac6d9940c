// bt::Error and the check macros used by every layer.
//
// User-causable problems (bad shapes, dtypes, devices, indices, configs, files)
// throw bt::Error with a message that names the input and says what to do.
// Broken internal invariants use BT_ASSERT, which throws bt::InternalError.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace bt {

/// An error the user can cause and fix. what() is the full message.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

/// A broken internal invariant: a bug in BluTrain, not in the caller's input.
class InternalError : public Error {
 public:
  explicit InternalError(const std::string& msg) : Error(msg) {}
};

/// Concatenates any streamable values into a string: bt::cat("x=", 3).
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  ((os << std::forward<Args>(args)), ...);
  return os.str();
}

namespace detail {
[[noreturn]] inline void fail(const std::string& msg) { throw Error(msg); }
[[noreturn]] inline void fail_internal(const char* file, int line, const char* cond, const std::string& msg) {
  throw InternalError(cat("internal error: ", cond, " failed at ", file, ":", line, msg.empty() ? "" : ": ",
                          msg, " (this is a BluTrain bug; please report it)"));
}
}  // namespace detail
}  // namespace bt

/// Throws bt::Error(bt::cat(...)) when cond is false.
#define BT_CHECK(cond, ...)                                  \
  do {                                                       \
    if (!(cond)) ::bt::detail::fail(::bt::cat(__VA_ARGS__)); \
  } while (0)

/// Throws bt::Error(bt::cat(...)) unconditionally.
#define BT_FAIL(...) ::bt::detail::fail(::bt::cat(__VA_ARGS__))

/// Internal invariant; failure is a BluTrain bug. Optional message arguments.
#define BT_ASSERT(cond, ...)                                                                     \
  do {                                                                                           \
    if (!(cond)) ::bt::detail::fail_internal(__FILE__, __LINE__, #cond, ::bt::cat(__VA_ARGS__)); \
  } while (0)
