#include "checkpoint/index.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "kernels/common/error.h"

namespace bt::ckpt {

using json = nlohmann::json;

int64_t SavedTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string printable(const std::string& bytes) {
  std::string shown;
  for (const char c : bytes) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned char>(c));
    shown += (c >= 32 && c < 127) ? std::string(1, c) : std::string(hex);
  }
  return shown;
}

void check_file_name(const std::string& name, const std::string& where, const std::string& what) {
  const bool plain = !name.empty() && name != "." && name != ".." && name.size() <= 255 &&
                     name.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
  BT_CHECK(plain, where, ": ", what, " names the file '", printable(name),
           "', which is not a plain file name inside the checkpoint's folder; the checkpoint is corrupt "
           "(Note [Files confined to their checkpoint])");
}

json piece_to_json(const SavedPiece& p) {
  json j = {{"file", p.file}, {"dataset", p.dataset}, {"begin", p.begin}, {"end", p.end}, {"crc32", p.crc32}};
  if (p.block > 0) {
    j["crc32_block"] = p.block;
    j["block_crc32"] = p.block_crc32;
  }
  return j;
}

SavedPiece piece_from_json(const json& j, const std::string& where, const std::string& tensor) {
  SavedPiece p;
  p.file = j.at("file").get<std::string>();
  p.dataset = j.at("dataset").get<std::string>();
  p.begin = j.at("begin").get<int64_t>();
  p.end = j.at("end").get<int64_t>();
  p.crc32 = j.at("crc32").get<uint32_t>();
  check_file_name(p.file, where, cat("piece ", p.dataset, " of tensor ", tensor));
  if (j.contains("crc32_block")) {
    p.block = j.at("crc32_block").get<int64_t>();
    p.block_crc32 = j.at("block_crc32").get<std::vector<uint32_t>>();
    BT_CHECK(p.block > 0 &&
                 static_cast<int64_t>(p.block_crc32.size()) == (p.end - p.begin + p.block - 1) / p.block,
             where, ": piece ", p.dataset, " of tensor ", tensor, " has ", p.block_crc32.size(),
             " block checksums for ", p.end - p.begin, " elements in blocks of ", p.block,
             "; the checkpoint is corrupt");
  }
  BT_CHECK(p.begin >= 0 && p.begin < p.end, where, ": piece ", p.dataset, " of tensor ", tensor,
           " has range [", p.begin, ", ", p.end, "); the checkpoint is corrupt");
  return p;
}

json Index::to_json() const {
  json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["step"] = step;
  j["world"] = {{"size", world_size}, {"strategy", strategy}};
  j["config"] = config;
  j["counters"] = counters;
  j["ranks"] = json::array();
  for (const RankRecord& r : ranks)
    j["ranks"].push_back(
        {{"rank", r.rank}, {"file", r.file}, {"device", r.device}, {"counters", r.counters}});
  j["tensors"] = json::object();
  for (const auto& [name, t] : tensors) {
    json pieces = json::array();
    for (const SavedPiece& p : t.pieces) pieces.push_back(piece_to_json(p));
    j["tensors"][name] = {{"shape", t.shape}, {"dtype", t.dtype}, {"pieces", pieces}};
  }
  return j;
}

Index Index::from_json(const json& j, const std::string& where) {
  try {
    BT_CHECK(j.value("format", std::string()) == kFormat, where,
             ": not a BluTrain checkpoint index (format '", j.value("format", std::string()), "', expected '",
             kFormat, "')");
    const int64_t v = j.at("version").get<int64_t>();
    BT_CHECK(v <= kVersion, where, ": checkpoint format version ", v, " is newer than this build's (",
             kVersion, "); use a newer blutrain");
    Index x;
    x.step = j.at("step").get<int64_t>();
    x.world_size = j.at("world").at("size").get<int>();
    x.strategy = j.at("world").at("strategy").get<std::string>();
    x.config = j.at("config");
    x.counters = j.at("counters").get<std::map<std::string, int64_t>>();
    for (const json& r : j.at("ranks")) {
      x.ranks.push_back({r.at("rank").get<int>(), r.at("file").get<std::string>(),
                         r.at("device").get<std::string>(),
                         r.at("counters").get<std::map<std::string, int64_t>>()});
      check_file_name(x.ranks.back().file, where, cat("rank ", x.ranks.back().rank));
    }
    for (const auto& [name, t] : j.at("tensors").items()) {
      SavedTensor st;
      st.shape = t.at("shape").get<std::vector<int64_t>>();
      st.dtype = t.at("dtype").get<std::string>();
      for (const json& p : t.at("pieces")) st.pieces.push_back(piece_from_json(p, where, name));
      std::sort(st.pieces.begin(), st.pieces.end(),
                [](const SavedPiece& a, const SavedPiece& b) { return a.begin < b.begin; });
      x.tensors.emplace(name, std::move(st));
    }
    return x;
  } catch (const json::exception& e) {
    BT_FAIL(where, ": malformed checkpoint index (", e.what(), "); the checkpoint is corrupt");
  }
}

std::vector<std::string> Index::completeness_problems() const {
  std::vector<std::string> out;
  std::set<std::string> files;
  for (const RankRecord& r : ranks) files.insert(r.file);
  if (static_cast<int>(ranks.size()) != world_size)
    out.push_back(cat("the index lists ", ranks.size(), " rank files for a world of ", world_size));
  for (const auto& [name, t] : tensors) {
    int64_t at = 0;
    for (const SavedPiece& p : t.pieces) {
      if (p.begin != at) {
        out.push_back(cat("tensor ", name, ": elements [", std::min(at, p.begin), ", ", std::max(at, p.begin),
                          ") are ", p.begin > at ? "missing" : "saved twice"));
        break;
      }
      if (!files.count(p.file)) out.push_back(cat("tensor ", name, ": piece in unknown file ", p.file));
      at = p.end;
    }
    if (at != t.numel() && (t.pieces.empty() || t.pieces.back().end == at))
      out.push_back(cat("tensor ", name, ": pieces cover ", at, " of its ", t.numel(), " elements"));
  }
  return out;
}

}  // namespace bt::ckpt
