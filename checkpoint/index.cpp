#include "checkpoint/index.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <set>
#include <utility>

#include "kernels/common/error.h"

namespace bt::ckpt {

using json = nlohmann::json;

int64_t SavedTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void check_file_name(const std::string& name, const std::string& where, const std::string& what) {
  const bool plain = !name.empty() && name != "." && name != ".." && name.size() <= 255 &&
                     name.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
  BT_CHECK(plain, where, ": ", what, " names the file '", printable(name),
           "', which is not a plain file name inside the checkpoint's folder; the checkpoint is corrupt "
           "(Note [Files confined to their checkpoint])");
}

namespace {

// Note [Integers from an index]: nlohmann's get<int64_t>() of a JSON float,
// or get<uint32_t>() of an integer out of range, converts with a plain cast,
// which is undefined behaviour for values that do not fit (libFuzzer found a
// crc32 of 3.59e10). So every integer an index holds is read through whole():
// a JSON integer that fits T, or the checkpoint is corrupt.
template <class T>
T whole(const json& j, const std::string& where, const std::string& what) {
  bool fits = false;
  T v{};
  if (j.is_number_unsigned()) {
    const auto u = j.get<uint64_t>();
    fits = std::in_range<T>(u);
    v = static_cast<T>(u);
  } else if (j.is_number_integer()) {
    const auto i = j.get<int64_t>();
    fits = std::in_range<T>(i);
    v = static_cast<T>(i);
  }
  BT_CHECK(fits, where, ": ", what, " is ", j.dump(), ", not an integer in [", std::numeric_limits<T>::min(),
           ", ", std::numeric_limits<T>::max(), "]; the checkpoint is corrupt");
  return v;
}

template <class T>
std::vector<T> whole_list(const json& j, const std::string& where, const std::string& what) {
  BT_CHECK(j.is_array(), where, ": ", what, " is not a list; the checkpoint is corrupt");
  std::vector<T> out;
  for (const json& e : j) out.push_back(whole<T>(e, where, what));
  return out;
}

std::map<std::string, int64_t> counters_of(const json& j, const std::string& where, const std::string& what) {
  BT_CHECK(j.is_object(), where, ": ", what, " is not an object; the checkpoint is corrupt");
  std::map<std::string, int64_t> out;
  for (const auto& [k, v] : j.items()) out[k] = whole<int64_t>(v, where, what + " " + k);
  return out;
}

/// A tensor's shape: non-negative sizes whose product fits int64 (numel()).
std::vector<int64_t> shape_of(const json& j, const std::string& where, const std::string& tensor) {
  std::vector<int64_t> shape = whole_list<int64_t>(j, where, cat("the shape of tensor ", tensor));
  int64_t n = 1;
  for (const int64_t d : shape)
    BT_CHECK(d >= 0 && !__builtin_mul_overflow(n, d, &n), where, ": tensor ", tensor, " has shape ", j.dump(),
             ", not a tensor's shape; the checkpoint is corrupt");
  return shape;
}

}  // namespace

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
  const std::string what = cat("piece ", p.dataset, " of tensor ", tensor);
  p.begin = whole<int64_t>(j.at("begin"), where, what + ": begin");
  p.end = whole<int64_t>(j.at("end"), where, what + ": end");
  p.crc32 = whole<uint32_t>(j.at("crc32"), where, what + ": crc32");
  check_file_name(p.file, where, what);
  BT_CHECK(p.begin >= 0 && p.begin < p.end, where, ": ", what, " has range [", p.begin, ", ", p.end,
           "); the checkpoint is corrupt");
  if (j.contains("crc32_block")) {
    p.block = whole<int64_t>(j.at("crc32_block"), where, what + ": crc32_block");
    p.block_crc32 = whole_list<uint32_t>(j.at("block_crc32"), where, what + ": block_crc32");
    const int64_t n = p.end - p.begin;  // > 0, and no overflow: 0 <= begin < end
    BT_CHECK(p.block > 0 && static_cast<int64_t>(p.block_crc32.size()) == n / p.block + (n % p.block != 0),
             where, ": ", what, " has ", p.block_crc32.size(), " block checksums for ", n,
             " elements in blocks of ", p.block, "; the checkpoint is corrupt");
  }
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
    const int64_t v = whole<int64_t>(j.at("version"), where, "version");
    BT_CHECK(v <= kVersion, where, ": checkpoint format version ", v, " is newer than this build's (",
             kVersion, "); use a newer blutrain");
    Index x;
    x.step = whole<int64_t>(j.at("step"), where, "step");
    x.world_size = whole<int>(j.at("world").at("size"), where, "world size");
    x.strategy = j.at("world").at("strategy").get<std::string>();
    x.config = j.at("config");
    x.counters = counters_of(j.at("counters"), where, "counter");
    for (const json& r : j.at("ranks")) {
      x.ranks.push_back({whole<int>(r.at("rank"), where, "rank"), r.at("file").get<std::string>(),
                         r.at("device").get<std::string>(),
                         counters_of(r.at("counters"), where, "rank counter")});
      check_file_name(x.ranks.back().file, where, cat("rank ", x.ranks.back().rank));
    }
    for (const auto& [name, t] : j.at("tensors").items()) {
      SavedTensor st;
      st.shape = shape_of(t.at("shape"), where, name);
      st.dtype = t.at("dtype").get<std::string>();
      for (const json& p : t.at("pieces")) st.pieces.push_back(piece_from_json(p, where, name));
      x.tensors.emplace(name, std::move(st));
    }
    x.sort_pieces();
    return x;
  } catch (const json::exception& e) {
    BT_FAIL(where, ": malformed checkpoint index (", e.what(), "); the checkpoint is corrupt");
  }
}

void Index::merge_fragment(const json& frag, int rank, const std::string& where) {
  try {
    BT_CHECK(frag.is_object(), where, ": a rank's fragment must be a JSON object; the checkpoint is corrupt");
    if (frag.contains("rank"))
      BT_CHECK(whole<int>(frag.at("rank"), where, "rank") == rank, where, ": the fragment of rank ", rank,
               " says it is rank ", frag.at("rank").dump(), "; the checkpoint is corrupt");
    RankRecord r{rank, frag.at("file").get<std::string>(), frag.at("device").get<std::string>(),
                 counters_of(frag.at("counters"), where, "rank counter")};
    check_file_name(r.file, where, cat("rank ", rank));
    for (const json& p : frag.at("pieces")) {
      const std::string name = p.at("name").get<std::string>();
      std::vector<int64_t> shape = shape_of(p.at("shape"), where, name);
      SavedTensor& t = tensors[name];
      if (t.pieces.empty())
        t.shape = std::move(shape);
      else
        BT_CHECK(shape == t.shape, where, ": rank ", rank, " saved tensor ", name, " with shape ",
                 p.at("shape").dump(), ", an earlier piece of it with shape ", json(t.shape).dump(),
                 "; the checkpoint is corrupt");
      t.pieces.push_back(piece_from_json(p, where, name));
    }
    ranks.push_back(std::move(r));
  } catch (const json::exception& e) {
    BT_FAIL(where, ": malformed fragment of rank ", rank, " (", e.what(), "); the checkpoint is corrupt");
  }
}

void Index::sort_pieces() {
  for (auto& [name, t] : tensors)
    std::sort(t.pieces.begin(), t.pieces.end(),
              [](const SavedPiece& a, const SavedPiece& b) { return a.begin < b.begin; });
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
