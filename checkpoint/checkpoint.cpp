#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "checkpoint/h5_util.h"
#include "checkpoint/shard_file.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/tensor/factory.h"
#include "runtime/tensor/shape.h"

namespace bt::ckpt {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string rank_stem(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank_%05d", rank);
  return buf;
}

/// Writes `text` to `path` through a temporary file, fsync and rename.
void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    BT_CHECK(f.good(), "cannot create '", tmp, "': ", std::strerror(errno));
    f << text;
    f.flush();
    BT_CHECK(f.good(), "cannot write '", tmp, "' (disk full?): ", std::strerror(errno));
  }
  h5::fsync_path(tmp, false);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    BT_FAIL("cannot rename '", tmp, "' to '", path, "': ", std::strerror(err));
  }
}

json read_json(const std::string& path) {
  std::ifstream f(path);
  BT_CHECK(f.good(), "cannot open '", path, "'");
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    BT_FAIL("'", path, "' is not valid JSON (", e.what(), "); the checkpoint is corrupt");
  }
}

/// Fault injection for tests: BT_CHECKPOINT_PAUSE="STEP:SECONDS" makes each
/// rank sleep after writing its files for the save of STEP, before the
/// commit -- a window in which a test kills a rank mid-save.
void pause_for_fault_injection(int64_t step) {
  const char* v = std::getenv("BT_CHECKPOINT_PAUSE");
  long long at = -1;
  double secs = 0;
  if (v && std::sscanf(v, "%lld:%lf", &at, &secs) == 2 && at == step)
    std::this_thread::sleep_for(std::chrono::duration<double>(secs));
}

void barrier(dist::ProcessGroup* pg) {
  if (pg) pg->barrier();
}

/// The step of "step_XXXXXXXX", or -1.
int64_t step_of(const std::string& name) {
  if (name.size() != 13 || name.rfind("step_", 0) != 0) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

/// Rank 0, after a commit: drops the checkpoints retention does not keep.
void apply_retention(const std::string& root, int64_t keep_last, int64_t keep_every) {
  if (keep_last <= 0) return;
  const std::vector<std::string> all = list(root);
  for (size_t i = 0; i + static_cast<size_t>(keep_last) < all.size(); ++i) {
    const int64_t step = step_of(fs::path(all[i]).filename().string());
    if (keep_every > 0 && step % keep_every == 0) continue;
    std::error_code ec;
    fs::remove_all(all[i], ec);
  }
}

}  // namespace

std::string dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string prepare(const SaveRequest& r, dist::ProcessGroup* pg) {
  const int rank = pg ? pg->rank() : 0;
  const std::string final_dir = (fs::path(r.root) / dir_name(r.step)).string();
  const std::string tmp_dir = final_dir + ".tmp";
  std::error_code ec;
  if (rank == 0) {
    fs::create_directories(r.root, ec);
    BT_CHECK(fs::is_directory(r.root, ec), "cannot create checkpoint directory '", r.root,
             "': ", ec.message());
    // Saves that died half-way, this step's included (a job restarted from
    // an earlier checkpoint saves this step again). No rank writes yet.
    for (const auto& e : fs::directory_iterator(r.root, ec))
      if (e.is_directory() && e.path().extension() == ".tmp") fs::remove_all(e.path(), ec);
    BT_CHECK(!fs::exists(fs::path(final_dir) / "index.json", ec), "checkpoint '", final_dir,
             "' already exists; use another checkpoint.dir or remove it");
    fs::remove_all(final_dir, ec);  // an index-less leftover is not a checkpoint
    fs::create_directories(tmp_dir, ec);
  }
  barrier(pg);  // the directory exists, empty, before anyone writes into it
  BT_CHECK(fs::is_directory(tmp_dir, ec), "cannot create '", tmp_dir, "': ", ec.message(),
           rank == 0 ? "" : " (rank 0 created it: is checkpoint.dir on a filesystem every rank shares?)");
  return tmp_dir;
}

void write_rank(const SaveRequest& r, int rank) {
  const std::string tmp_dir = (fs::path(r.root) / dir_name(r.step)).string() + ".tmp";
  const std::string stem = rank_stem(rank);
  const auto written = write_shard_file(tmp_dir + "/" + stem + ".h5", stem + ".h5", r.pieces, r.background);
  json frag;
  frag["rank"] = rank;
  frag["file"] = stem + ".h5";
  frag["device"] = r.device;
  frag["counters"] = r.rank_counters;
  frag["pieces"] = json::array();
  for (size_t i = 0; i < written.size(); ++i) {
    json p = piece_to_json(written[i].second);
    p["name"] = written[i].first;
    p["shape"] = r.pieces[i].shape;
    frag["pieces"].push_back(std::move(p));
  }
  write_atomically(tmp_dir + "/" + stem + ".json", frag.dump());
  pause_for_fault_injection(r.step);
}

std::string commit(const SaveRequest& r, int world) {
  const std::string final_dir = (fs::path(r.root) / dir_name(r.step)).string();
  const std::string tmp_dir = final_dir + ".tmp";
  std::error_code ec;
  try {
    Index idx;
    idx.step = r.step;
    idx.world_size = world;
    idx.strategy = r.strategy;
    idx.config = r.config;
    idx.counters = r.counters;
    for (int q = 0; q < world; ++q) {
      const std::string frag_path = tmp_dir + "/" + rank_stem(q) + ".json";
      idx.merge_fragment(read_json(frag_path), q, frag_path);
    }
    idx.sort_pieces();
    const std::vector<std::string> problems = idx.completeness_problems();
    BT_CHECK(problems.empty(), "checkpoint '", final_dir, "' would be incomplete: ", problems.front(),
             " (a strategy wrote overlapping or missing shares)");
    write_atomically(tmp_dir + "/index.json", idx.to_json().dump(1));
    h5::fsync_path(tmp_dir, true);
    if (std::rename(tmp_dir.c_str(), final_dir.c_str()) != 0)
      BT_FAIL("cannot rename '", tmp_dir, "' to '", final_dir, "': ", std::strerror(errno));
    h5::fsync_path(r.root, true);
    write_atomically((fs::path(r.root) / "latest").string(), dir_name(r.step) + "\n");
    h5::fsync_path(r.root, true);
    apply_retention(r.root, r.keep_last, r.keep_every);
  } catch (...) {
    fs::remove_all(tmp_dir, ec);
    throw;
  }
  return final_dir;
}

std::string save(const SaveRequest& r, dist::ProcessGroup* pg) {
  const int rank = pg ? pg->rank() : 0, world = pg ? pg->size() : 1;
  prepare(r, pg);
  try {
    write_rank(r, rank);
  } catch (...) {
    std::error_code ec;
    if (world == 1) fs::remove_all((fs::path(r.root) / dir_name(r.step)).string() + ".tmp", ec);
    throw;  // with more ranks the job ends; the next save removes the leftovers
  }
  barrier(pg);
  std::string dir = (fs::path(r.root) / dir_name(r.step)).string();
  if (rank == 0) dir = commit(r, world);
  barrier(pg);
  return dir;
}

std::vector<std::string> list(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const int64_t step = step_of(e.path().filename().string());
    if (step >= 0 && e.is_directory() && fs::is_regular_file(e.path() / "index.json", ec))
      found.emplace_back(step, e.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [s, p] : found) out.push_back(std::move(p));
  return out;
}

std::string latest(const std::string& root) {
  std::ifstream f(fs::path(root) / "latest");
  std::string name;
  if (f >> name && step_of(name) >= 0) {
    const fs::path dir = fs::path(root) / name;
    std::error_code ec;
    const std::vector<std::string> all = list(root);
    // `latest` is replaced after the rename, so a newer complete checkpoint
    // can exist when a job died in between: take the newest.
    if (fs::is_regular_file(dir / "index.json", ec) && !all.empty() && all.back() == dir.string())
      return dir.string();
  }
  const std::vector<std::string> all = list(root);
  return all.empty() ? std::string() : all.back();
}

std::string set_aside(const std::string& dir, const std::string& fallback) {
  const fs::path from(dir), root = from.parent_path();
  std::error_code ec;
  std::string to = dir + ".unusable";
  for (int n = 2; fs::exists(to, ec); ++n) to = cat(dir, ".unusable.", n);
  if (std::rename(dir.c_str(), to.c_str()) != 0)
    BT_FAIL("cannot move the unusable checkpoint '", dir, "' aside to '", to, "': ", std::strerror(errno),
            "; remove it by hand before the run saves its step again");
  std::ifstream f(root / "latest");
  std::string name;
  if (f >> name && name == from.filename().string()) {
    write_atomically((root / "latest").string(), fs::path(fallback).filename().string() + "\n");
    h5::fsync_path(root.string(), true);
  }
  return to;
}

std::string resolve(const std::string& path, std::string* chosen) {
  if (chosen) chosen->clear();
  std::error_code ec;
  if (fs::is_regular_file(fs::path(path) / "index.json", ec)) return path;
  BT_CHECK(fs::is_directory(path, ec), "'", path,
           "' does not exist; give a checkpoint (ROOT/step_XXXXXXXX) or ",
           "a checkpoint root (checkpoint.dir)");
  const std::string dir = latest(path);
  BT_CHECK(
      !dir.empty(), "'", path, "' is not a checkpoint (it has no index.json) and holds no complete ",
      "checkpoint (no step_XXXXXXXX/ with an index.json); give a checkpoint or the checkpoint.dir of a run ",
      "that saved one");
  if (chosen)
    *chosen = cat(path, " is a checkpoint root: using its latest checkpoint, ", dir, " (step ",
                  step_of(fs::path(dir).filename().string()), ")");
  return dir;
}

std::string latest_pointer_problem(const std::string& root) {
  const fs::path p = fs::path(root) / "latest";
  std::error_code ec;
  if (!fs::exists(p, ec)) return "";
  std::ifstream f(p);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::string name = text;
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  if (step_of(name) < 0)
    return cat("'", p.string(), "' holds \"", printable(text),
               "\", which is not a checkpoint name (step_XXXXXXXX): the file is damaged");
  if (!fs::is_regular_file(fs::path(root) / name / "index.json", ec))
    return cat("'", p.string(), "' names ", name, ", which is not a complete checkpoint in ", root);
  return "";
}

uint64_t bytes_on_disk(const std::string& dir) {
  uint64_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file(ec)) n += e.file_size(ec);
  return n;
}

Index read_index(const std::string& dir) {
  const std::string path = (fs::path(dir) / "index.json").string();
  std::error_code ec;
  BT_CHECK(fs::is_regular_file(path, ec), "'", dir, "' is not a checkpoint: it has no index.json (",
           "an unfinished save, or the wrong directory)");
  return Index::from_json(read_json(path), path);
}

namespace {

/// The saved ranges that fill piece `p` (elements [p.begin, p.end) of its
/// tensor) into `out`; throws Incompatible for another name or shape.
std::vector<ShardReader::Range> ranges_for(const std::string& dir, const Index& idx,
                                           const dist::StatePiece& p, float* out) {
  auto it = idx.tensors.find(p.name);
  if (it == idx.tensors.end())
    throw Incompatible(cat("checkpoint '", dir, "' has no tensor '", p.name,
                           "': it was saved from a different model; start without train.resume or use a "
                           "checkpoint of this model"));
  const SavedTensor& t = it->second;
  if (t.shape != p.shape)
    throw Incompatible(cat("checkpoint '", dir, "': tensor '", p.name, "' has shape ", shape_str(t.shape),
                           " there but ", shape_str(p.shape), " in this model (a different model shape)"));
  std::vector<ShardReader::Range> ranges;
  int64_t covered = 0;
  for (const SavedPiece& s : t.pieces) {
    const int64_t lo = std::max(p.begin, s.begin), hi = std::min(p.end, s.end);
    if (lo >= hi) continue;
    ranges.push_back({&s, lo, hi, out + (lo - p.begin)});
    covered += hi - lo;
  }
  BT_CHECK(covered == p.end - p.begin, "checkpoint '", dir, "': tensor '", p.name, "' elements [", p.begin,
           ", ", p.end, ") are not all saved (", covered, " found); the index is incomplete");
  return ranges;
}

}  // namespace

void load_pieces(const std::string& dir, const Index& idx, const std::vector<dist::StatePiece>& pieces) {
  // In rounds of about kRound elements of host memory: the rounds' reads run
  // in parallel (ShardReader), then their pieces are copied to the device.
  constexpr int64_t kRound = int64_t{64} << 20;
  ShardReader reader(dir);
  NoGradGuard ng;
  for (size_t first = 0; first < pieces.size();) {
    std::vector<Tensor> host;
    std::vector<ShardReader::Range> ranges;
    size_t last = first;
    for (int64_t n = 0;
         last < pieces.size() && (last == first || n + pieces[last].end - pieces[last].begin <= kRound);
         ++last) {
      const dist::StatePiece& p = pieces[last];
      n += p.end - p.begin;
      TensorOptions opts;
      opts.pinned = p.data.device().is_cuda();
      host.push_back(empty({p.end - p.begin}, opts));
      for (const ShardReader::Range& r : ranges_for(dir, idx, p, host.back().data<float>()))
        ranges.push_back(r);
    }
    reader.read(ranges);
    for (size_t i = first; i < last; ++i) Tensor(pieces[i].data).copy_(host[i - first]);
    first = last;
  }
}

std::vector<std::string> verify(const std::string& dir) {
  std::vector<std::string> problems;
  Index idx;
  try {
    idx = read_index(dir);
  } catch (const Error& e) {
    return {e.what()};
  }
  problems = idx.completeness_problems();
  ShardReader reader(dir);
  std::vector<float> buf;
  for (const auto& [name, t] : idx.tensors)
    for (const SavedPiece& p : t.pieces) {
      buf.resize(static_cast<size_t>(p.end - p.begin));
      try {
        reader.read({{&p, p.begin, p.end, buf.data()}});  // every block against its crc32
      } catch (const Error& e) {
        problems.push_back(e.what());
      }
    }
  return problems;
}

}  // namespace bt::ckpt
