// The command-line options of the subcommands: the part of cxxopts they use,
// behind a header that does not include it.
//
// Note [One translation unit for cxxopts]: cxxopts is header-only, and every
// file that parses with it compiles its parser (std::regex among it) again:
// about 7 s of g++ -O2 per file, 23 s under the sanitizers, measured on the
// 2-core development machine (2026-11-24), for nine subcommands. Precompiling
// the header saves nothing (the time is instantiation, not parsing). So the
// subcommands declare and read options through this interface, whose calls
// are cxxopts' own (Options, add_options, value<T>()->default_value,
// parse_positional, positional_help, parse, help; ParseResult's count,
// operator[]().as<T>() and unmatched), and launcher/cli.cpp is the one file
// that includes cxxopts. Option values are bool, std::string,
// std::vector<std::string>, int, int64_t, uint64_t and double.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace bt::launcher::cli {

/// What an option takes, made by value<T>(); a flag (bool) when none is given.
class Value : public std::enable_shared_from_this<Value> {
 public:
  enum class Kind { kBool, kString, kStrings, kInt, kInt64, kUInt64, kDouble };
  explicit Value(Kind k) : kind(k) {}
  /// The value when the option is not given (parsed as if it were).
  std::shared_ptr<Value> default_value(const std::string& v) {
    def = v;
    return shared_from_this();
  }
  Kind kind;
  std::optional<std::string> def;
};

/// What value<T>() makes: one of the seven types an option can take.
template <class T>
std::shared_ptr<Value> value() {
  using K = Value::Kind;
  K k;
  if constexpr (std::is_same_v<T, bool>)
    k = K::kBool;
  else if constexpr (std::is_same_v<T, std::string>)
    k = K::kString;
  else if constexpr (std::is_same_v<T, std::vector<std::string>>)
    k = K::kStrings;
  else if constexpr (std::is_same_v<T, int>)
    k = K::kInt;
  else if constexpr (std::is_same_v<T, int64_t>)
    k = K::kInt64;
  else if constexpr (std::is_same_v<T, uint64_t>)
    k = K::kUInt64;
  else if constexpr (std::is_same_v<T, double>)
    k = K::kDouble;
  else
    static_assert(sizeof(T) == 0, "cli::value<T>: T must be one of Value::Kind's types");
  return std::make_shared<Value>(k);
}

/// The options of one command line, once parsed.
class ParseResult {
 public:
  ParseResult();
  ~ParseResult();
  ParseResult(ParseResult&&) noexcept;
  ParseResult& operator=(ParseResult&&) noexcept;

  /// How often the option was given (0 when only its default applies).
  size_t count(const std::string& name) const;
  /// One option's value: as<T>() with the T of its value<T>().
  class Entry {
   public:
    template <class T>
    T as() const;

   private:
    friend class ParseResult;
    Entry(const ParseResult& r, std::string name) : r_(r), name_(std::move(name)) {}
    const ParseResult& r_;
    std::string name_;
  };
  Entry operator[](const std::string& name) const { return Entry(*this, name); }
  /// The arguments that were no option (when no positional option took them).
  std::vector<std::string> unmatched() const;

 private:
  friend class Options;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class Options {
 public:
  Options(const std::string& program, const std::string& description);
  ~Options();
  Options(const Options&) = delete;
  Options& operator=(const Options&) = delete;

  /// Adds options: add_options()("n,name", "help", value<int>()->default_value("1"))(...).
  class Adder {
   public:
    Adder& operator()(const std::string& names, const std::string& help,
                      const std::shared_ptr<Value>& v = value<bool>());

   private:
    friend class Options;
    explicit Adder(Options& o) : o_(o) {}
    Options& o_;
  };
  Adder add_options() { return Adder(*this); }
  /// Arguments that are no option fill these options, in order.
  void parse_positional(const std::vector<std::string>& names);
  /// What --help shows for the positional arguments.
  void positional_help(const std::string& text);
  /// Throws std::exception (cxxopts' own) for an unknown option or a bad value.
  ParseResult parse(int argc, char** argv);
  std::string help() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bt::launcher::cli
