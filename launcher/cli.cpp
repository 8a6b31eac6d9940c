// The one file that includes cxxopts: Note [One translation unit for cxxopts]
// in launcher/cli.h.
#include "launcher/cli.h"

#include <cxxopts.hpp>

namespace bt::launcher::cli {

struct ParseResult::Impl {
  cxxopts::ParseResult r;
};

struct Options::Impl {
  explicit Impl(const std::string& program, const std::string& description) : o(program, description) {}
  cxxopts::Options o;
};

ParseResult::ParseResult() : impl_(std::make_unique<Impl>()) {}
ParseResult::~ParseResult() = default;
ParseResult::ParseResult(ParseResult&&) noexcept = default;
ParseResult& ParseResult::operator=(ParseResult&&) noexcept = default;

size_t ParseResult::count(const std::string& name) const { return impl_->r.count(name); }

std::vector<std::string> ParseResult::unmatched() const { return impl_->r.unmatched(); }

template <class T>
T ParseResult::Entry::as() const {
  return r_.impl_->r[name_].as<T>();
}
template bool ParseResult::Entry::as<bool>() const;
template std::string ParseResult::Entry::as<std::string>() const;
template std::vector<std::string> ParseResult::Entry::as<std::vector<std::string>>() const;
template int ParseResult::Entry::as<int>() const;
template int64_t ParseResult::Entry::as<int64_t>() const;
template uint64_t ParseResult::Entry::as<uint64_t>() const;
template double ParseResult::Entry::as<double>() const;

Options::Options(const std::string& program, const std::string& description)
    : impl_(std::make_unique<Impl>(program, description)) {}
Options::~Options() = default;

namespace {

template <class T>
std::shared_ptr<cxxopts::Value> typed(const Value& v) {
  auto t = cxxopts::value<T>();
  if (v.def) t->default_value(*v.def);
  return t;
}

std::shared_ptr<cxxopts::Value> to_cxxopts(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kBool:
      return typed<bool>(v);
    case Value::Kind::kString:
      return typed<std::string>(v);
    case Value::Kind::kStrings:
      return typed<std::vector<std::string>>(v);
    case Value::Kind::kInt:
      return typed<int>(v);
    case Value::Kind::kInt64:
      return typed<int64_t>(v);
    case Value::Kind::kUInt64:
      return typed<uint64_t>(v);
    case Value::Kind::kDouble:
      return typed<double>(v);
  }
  return typed<bool>(v);
}

}  // namespace

Options::Adder& Options::Adder::operator()(const std::string& names, const std::string& help,
                                           const std::shared_ptr<Value>& v) {
  o_.impl_->o.add_options()(names, help, to_cxxopts(*v));
  return *this;
}

void Options::parse_positional(const std::vector<std::string>& names) { impl_->o.parse_positional(names); }

void Options::positional_help(const std::string& text) { impl_->o.positional_help(text); }

ParseResult Options::parse(int argc, char** argv) {
  ParseResult r;
  r.impl_->r = impl_->o.parse(argc, argv);
  return r;
}

std::string Options::help() const { return impl_->o.help(); }

}  // namespace bt::launcher::cli
