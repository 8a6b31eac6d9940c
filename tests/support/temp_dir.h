// A uniquely named temporary directory, removed with its contents on scope exit.
#pragma once

#include <filesystem>
#include <random>
#include <string>

#include <unistd.h>

namespace bt::test {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()) + "_" +
                                                      std::to_string(rd()) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  /// path()/name as a string.
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace bt::test
