// The index of one checkpoint, DIR/index.json, written last by rank 0: what
// the checkpoint holds and where each piece of each tensor lies
// (docs/checkpoint-format.md). A checkpoint directory without it is not a
// checkpoint.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/core/printable.h"  // printable(), for names from an index

namespace bt::ckpt {

inline constexpr const char* kFormat = "blutrain-checkpoint";
/// 2: contiguous datasets with a crc32 per block of `crc32_block` elements
/// (1: chunked datasets with Fletcher-32, one crc32 per piece; still read).
inline constexpr int64_t kVersion = 2;

/// One saved range [begin, end) of a tensor's flattened elements.
struct SavedPiece {
  std::string file;     // rank_RRRRR.h5, relative to the checkpoint directory
  std::string dataset;  // "<tensor name>/<begin>"
  int64_t begin = 0, end = 0;
  uint32_t crc32 = 0;  // zlib crc32 of the little-endian f32 bytes
  // The crc32 of each block of `block` elements ([begin + k * block, ...),
  // the last one shorter), so that a partial read checks what it reads.
  // block == 0 (format version 1): only the whole piece's crc32.
  int64_t block = 0;
  std::vector<uint32_t> block_crc32;
};

/// Note [Files confined to their checkpoint]
/// An index names its rank files and every piece's file; each must be a plain
/// file name inside the checkpoint's folder (no separator, not "." or "..",
/// no NUL), so a hand-edited or hostile index can never make a load or a
/// verify open a file elsewhere; ShardReader also refuses a file that is a
/// symbolic link leading out of the folder. Either is a corrupt checkpoint:
/// resume falls back to the one before. Throws bt::Error naming `where` and
/// `what` (e.g. "piece param/a/0 of tensor param/a") unless `name` is such a name.
void check_file_name(const std::string& name, const std::string& where, const std::string& what);

/// A piece as the index (and a rank's fragment) stores it.
nlohmann::json piece_to_json(const SavedPiece& p);
/// Throws bt::Error naming `where` and `tensor` for a malformed piece.
SavedPiece piece_from_json(const nlohmann::json& j, const std::string& where, const std::string& tensor);

struct SavedTensor {
  std::vector<int64_t> shape;
  std::string dtype = "f32";
  std::vector<SavedPiece> pieces;  // sorted by begin
  int64_t numel() const;
};

/// What one rank wrote (its fragment, rank_RRRRR.json, merged into the index).
struct RankRecord {
  int rank = 0;
  std::string file, device;
  std::map<std::string, int64_t> counters;  // per-rank scalars (its RNG state)
};

struct Index {
  int64_t step = 0;
  int world_size = 1;
  std::string strategy;                     // "local" for one process
  nlohmann::json config;                    // the resolved job config
  std::map<std::string, int64_t> counters;  // job-wide scalars (step, data position, AdamW steps)
  std::vector<RankRecord> ranks;
  std::map<std::string, SavedTensor> tensors;

  nlohmann::json to_json() const;
  /// Throws bt::Error naming `where` for a malformed index or another format/version.
  static Index from_json(const nlohmann::json& j, const std::string& where);
  /// Adds rank `rank`'s fragment (what write_rank left in rank_RRRRR.json:
  /// its file, device, counters and pieces, each piece with its tensor's
  /// name and shape) as the commit merges them. Throws bt::Error naming `where` for a malformed fragment, a
  /// file outside the folder, or a shape that an earlier piece gave otherwise.
  void merge_fragment(const nlohmann::json& frag, int rank, const std::string& where);
  /// Sorts each tensor's pieces by begin (after the last merge_fragment).
  void sort_pieces();
  /// Problems that make the index unusable: a tensor whose pieces leave a gap
  /// or overlap, or do not end at its size; a piece in a file no rank wrote.
  std::vector<std::string> completeness_problems() const;
};

}  // namespace bt::ckpt
