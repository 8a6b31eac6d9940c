// libFuzzer target: the BPE tokenizer (runtime/data/bpe.h) on arbitrary bytes.
//   - pretokenize(valid UTF-8): the matches, concatenated, are the text;
//   - split_chunks: consecutive pieces that cover the text, each (but the
//     last) of at least the target size, and encoded piece by piece they give
//     the tokens of the whole text;
//   - encode then decode gives back the text -- exactly for valid UTF-8, and
//     sanitize_utf8(text) (invalid bytes as U+FFFD) otherwise;
//   - every id is inside the vocabulary.
// The tokenizer's files come from BT_TOKENIZER_DIR (default data/tokenizer,
// what scripts/fetch-data writes); without them only the first two run, and
// with BT_REQUIRE_DATA=1 (CI) their absence is a failure.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "kernels/common/error.h"
#include "runtime/data/bpe.h"
#include "runtime/data/unicode.h"

namespace {

const bt::Gpt2Tokenizer* tokenizer() {
  static const std::unique_ptr<bt::Gpt2Tokenizer> t = []() -> std::unique_ptr<bt::Gpt2Tokenizer> {
    const char* env = std::getenv("BT_TOKENIZER_DIR");
    const std::string dir = env && *env ? env : "data/tokenizer";
    try {
      auto tok = std::make_unique<bt::Gpt2Tokenizer>(bt::Gpt2Tokenizer::load(dir));
      std::fprintf(stderr, "fuzz_bpe: the tokenizer of %s (%d tokens)\n", dir.c_str(), tok->vocab_size());
      return tok;
    } catch (const bt::Error& e) {
      const char* require = std::getenv("BT_REQUIRE_DATA");
      std::fprintf(stderr, "fuzz_bpe: no tokenizer (%s): pretokenize and split_chunks only\n", e.what());
      if (require && std::string(require) == "1") std::abort();  // CI fetched it: its absence is a failure
      return nullptr;
    }
  }();
  return t.get();
}

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view raw(reinterpret_cast<const char*>(data), size);
  const std::string text = bt::unicode::sanitize_utf8(raw);
  check(bt::unicode::is_valid_utf8(text));
  if (bt::unicode::is_valid_utf8(raw)) check(text == raw);
  std::string joined;
  for (const std::string_view piece : bt::Gpt2Tokenizer::pretokenize(text)) joined += piece;
  check(joined == text);
  const size_t target = size == 0 ? 1 : 1 + data[0] % 64;
  const std::vector<std::string_view> chunks = bt::Gpt2Tokenizer::split_chunks(text, target);
  joined.clear();
  for (size_t i = 0; i < chunks.size(); ++i) {
    check(i + 1 == chunks.size() || chunks[i].size() >= target);
    joined += chunks[i];
  }
  check(joined == text);
  const bt::Gpt2Tokenizer* t = tokenizer();
  if (t == nullptr) return 0;
  const std::vector<int32_t> ids = t->encode(raw);
  for (const int32_t id : ids) check(id >= 0 && id < t->vocab_size());
  check(t->decode(ids) == text);
  std::vector<int32_t> pieces;
  for (const std::string_view c : chunks) {
    const std::vector<int32_t> part = t->encode(c);
    pieces.insert(pieces.end(), part.begin(), part.end());
  }
  check(pieces == ids);
  return 0;
}
