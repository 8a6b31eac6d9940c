// Gpt2Tokenizer: the pre-tokenizer's splits, BPE merging on small made-up
// vocabularies (incl. Encoder.js's comma quirk), load errors, and on the real
// GPT-2 files (scripts/fetch-data tokenizer): known ids, round trips, chunking.
// tests/runtime/data/test_bpe_golden.cpp compares with Encoder.js itself.

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/common/error.h"
#include "runtime/data/bpe.h"
#include "runtime/data/unicode.h"
#include "tests/support/error_message.h"
#include "tests/support/fetched_data.h"
#include "tests/support/temp_dir.h"

namespace bt {
namespace {

using Pieces = std::vector<std::string_view>;

// ------------------------------------------------------------ pre-tokenizer (no files)

TEST(Pretokenize, WordsTakeOneLeadingSpace) {
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(Gpt2Tokenizer::pretokenize(" 123 4x"), (Pieces{" 123", " 4", "x"}));
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("x !!? ok"), (Pieces{"x", " !!?", " ok"}));
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("3.14, 1,000"), (Pieces{"3", ".", "14", ",", " 1", ",", "000"}));
  EXPECT_EQ(Gpt2Tokenizer::pretokenize(""), Pieces{});
}

TEST(Pretokenize, Contractions) {
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("I'm he's they'll we've you're I'd don't"),
            (Pieces{"I", "'m", " he", "'s", " they", "'ll", " we", "'ve", " you", "'re", " I", "'d", " don",
                    "'t"}));
  // Upper case is not a contraction; an apostrophe elsewhere is punctuation.
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("HE'S"), (Pieces{"HE", "'", "S"}));
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("rock 'n' roll"), (Pieces{"rock", " '", "n", "'", " roll"}));
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("'''"), (Pieces{"'''"}));
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("'s's!'s"), (Pieces{"'s", "'s", "!'", "s"}));
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("'llama 'rex"), (Pieces{"'ll", "ama", " '", "rex"}));
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("'"), (Pieces{"'"}));
}

TEST(Pretokenize, WhitespaceRuns) {
  // A run before a non-space leaves its last character to the next piece.
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("a  b"), (Pieces{"a", " ", " b"}));
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("a\n\nb"), (Pieces{"a", "\n", "\n", "b"}));
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("a \t\n  b"), (Pieces{"a", " \t\n ", " b"}));
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("a\r\nb"), (Pieces{"a", "\r", "\n", "b"}));
  // At the end the whole run is one piece.
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("a   \n"), (Pieces{"a", "   \n"}));
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("a "), (Pieces{"a", " "}));
  // Only U+0020 attaches to a word; other spaces (tab, U+00A0, U+3000) stand alone.
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("a\tb"), (Pieces{"a", "\t", "b"}));
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("a\u00A0b"), (Pieces{"a", "\u00A0", "b"}));
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("a \u3000b"), (Pieces{"a", " ", "\u3000", "b"}));
}

TEST(Pretokenize, Unicode) {
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("naïve café"), (Pieces{"naïve", " café"}));
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("日本語のテキスト"), (Pieces{"日本語のテキスト"}));
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("😀😀 ok"), (Pieces{"😀😀", " ok"}));
  // A combining mark (Mn) is not a letter: it splits the word.
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("cafe\u0301s"), (Pieces{"cafe", "\u0301", "s"}));
  EXPECT_EQ(Gpt2Tokenizer::pretokenize("x ٣٤"), (Pieces{"x", " ٣٤"}));
}

TEST(Pretokenize, PiecesConcatenateToTheText) {
  std::mt19937 rng(7);
  const std::vector<std::string> atoms = {"a",      "Z",   " ",  "  ",   "\n", "\t",    "'",
                                          "'s",     "'LL", "1",  "é",    "中", "😀",     "\u00A0",
                                          "\u0301", ".",   "!?", "\r\n", "ß",  "\u3000"};
  for (int trial = 0; trial < 2000; ++trial) {
    std::string s;
    const int n = static_cast<int>(rng() % 30);
    for (int i = 0; i < n; ++i) s += atoms[rng() % atoms.size()];
    std::string joined;
    for (std::string_view p : Gpt2Tokenizer::pretokenize(s)) {
      ASSERT_FALSE(p.empty());
      joined += p;
    }
    ASSERT_EQ(joined, s);
  }
}

// ------------------------------------------------------------ made-up vocabularies (no files)

// GPT-2's bytes_to_unicode(), written out independently of bpe.cpp.
std::string byte_char(int b) {
  static const auto table = [] {
    std::array<char32_t, 256> m{};
    char32_t n = 0;
    for (int x = 0; x < 256; ++x)
      m[x] = ((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255)) ? x : 256 + n++;
    return m;
  }();
  std::string s;
  unicode::append_utf8(s, table[b]);
  return s;
}

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o + "\"";
}

// A tokenizer folder: the 256 byte tokens (ids 0..255), each merge's result in
// order, then <|endoftext|>. Merges are written in ASCII, which maps to itself.
using Merges = std::vector<std::pair<std::string, std::string>>;

struct MiniVocab {
  test::TempDir dir{"bt_bpe_mini"};
  std::vector<std::string> tokens;

  explicit MiniVocab(const Merges& merges) {
    for (int b = 0; b < 256; ++b) tokens.push_back(byte_char(b));
    std::ofstream bpe(dir.file("vocab.bpe"), std::ios::binary);
    bpe << "#version: 0.2\n";
    for (const auto& [a, b] : merges) {
      bpe << a << " " << b << "\n";
      if (std::find(tokens.begin(), tokens.end(), a + b) == tokens.end()) tokens.push_back(a + b);
    }
    tokens.push_back("<|endoftext|>");
    std::ofstream enc(dir.file("encoder.json"), std::ios::binary);
    enc << "{";
    for (size_t i = 0; i < tokens.size(); ++i) enc << (i ? ", " : "") << json_string(tokens[i]) << ": " << i;
    enc << "}";
  }
  int32_t id(const std::string& token) const {
    return static_cast<int32_t>(std::find(tokens.begin(), tokens.end(), token) - tokens.begin());
  }
  Gpt2Tokenizer load() const { return Gpt2Tokenizer::load(dir.path().string()); }
};

TEST(Gpt2TokenizerMini, MergesByRank) {
  const MiniVocab v(Merges{{"a", "b"}, {"ab", "c"}, {"b", "c"}});
  const Gpt2Tokenizer t = v.load();
  EXPECT_EQ(t.vocab_size(), 256 + 3 + 1);
  EXPECT_EQ(t.eot(), v.id("<|endoftext|>"));
  EXPECT_EQ(t.encode("abc"), (std::vector<int32_t>{v.id("abc")}));
  EXPECT_EQ(t.encode("bc"), (std::vector<int32_t>{v.id("bc")}));
  EXPECT_EQ(t.encode("cab"), (std::vector<int32_t>{v.id("c"), v.id("ab")}));
  EXPECT_EQ(t.decode(t.encode("abcab cab")), "abcab cab");
}

TEST(Gpt2TokenizerMini, RepeatedPairMergesLeftToRight) {
  const MiniVocab v(Merges{{"a", "a"}});
  const Gpt2Tokenizer t = v.load();
  EXPECT_EQ(t.encode("aaa"), (std::vector<int32_t>{v.id("aa"), v.id("a")}));
  EXPECT_EQ(t.encode("aaaa"), (std::vector<int32_t>{v.id("aa"), v.id("aa")}));
}

// Encoder.js keys ranks by `first + "," + second`, so the pair (`",`, `"`)
// borrows the rank of the merge (`"`, `,"`): both are the key `",,"`.
TEST(Gpt2TokenizerMini, PairsWithTheSameJsKeyMergeAlike) {
  const MiniVocab v(Merges{{"\"", ","}, {",", "\""}, {"\"", ",\""}});
  const Gpt2Tokenizer t = v.load();
  // `"` `,` `"` -> `",` `"` (rank 0 first), which GPT-2's encoder.py would
  // leave as two tokens; Encoder.js merges them.
  EXPECT_EQ(t.encode("\",\""), (std::vector<int32_t>{v.id("\",\"")}));
}

TEST(Gpt2TokenizerMini, LongWordsMergeFully) {
  const MiniVocab v(Merges{{"a", "b"}, {"ab", "ab"}, {"abab", "abab"}});
  const Gpt2Tokenizer t = v.load();
  std::string s;
  for (int i = 0; i < 20000; ++i) s += "ab";
  const std::vector<int32_t> ids = t.encode(s);
  EXPECT_EQ(ids, std::vector<int32_t>(5000, v.id("abababab")));
}

// ------------------------------------------------------------ load errors (no files)

TEST(Gpt2TokenizerLoad, MissingFolderSaysToFetch) {
  const std::string msg = test::error_message([] { Gpt2Tokenizer::load("/nonexistent/bt_tokenizer"); });
  EXPECT_NE(msg.find("/nonexistent/bt_tokenizer/encoder.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("scripts/fetch-data tokenizer"), std::string::npos) << msg;
}

TEST(Gpt2TokenizerLoad, MissingVocabBpe) {
  const MiniVocab v(Merges{{"a", "b"}});
  std::filesystem::remove(v.dir.file("vocab.bpe"));
  const std::string msg = test::error_message([&] { v.load(); });
  EXPECT_NE(msg.find(v.dir.file("vocab.bpe")), std::string::npos) << msg;
  EXPECT_NE(msg.find("scripts/fetch-data tokenizer"), std::string::npos) << msg;
}

void expect_corrupt(const MiniVocab& v, const std::string& file, const std::string& content,
                    const std::string& says) {
  std::ofstream(v.dir.file(file), std::ios::binary | std::ios::trunc) << content;
  const std::string msg = test::error_message([&] { v.load(); });
  EXPECT_NE(msg.find(v.dir.file(file)), std::string::npos) << msg;
  EXPECT_NE(msg.find(says), std::string::npos) << msg;
  EXPECT_NE(msg.find("scripts/fetch-data tokenizer"), std::string::npos) << msg;
}

TEST(Gpt2TokenizerLoad, CorruptEncoderJson) {
  const MiniVocab v(Merges{{"a", "b"}});
  expect_corrupt(v, "encoder.json", "{\"a\": 0, \"b\": ", "not valid JSON");
  expect_corrupt(v, "encoder.json", "[1, 2, 3]", "JSON object");
  expect_corrupt(v, "encoder.json", "{\"a\": 0, \"b\": 0}", "distinct integers");
  expect_corrupt(v, "encoder.json", "{\"a\": \"x\"}", "distinct integers");
  expect_corrupt(v, "encoder.json", "{\"a\": 0, \"b\": 1}", "one-byte token");
  expect_corrupt(v, "encoder.json", "{\"a b\": 0}", "byte-to-unicode");
}

TEST(Gpt2TokenizerLoad, MissingEndOfText) {
  const MiniVocab v(Merges{});
  std::string json = "{";
  for (int b = 0; b < 256; ++b)
    json += (b ? ", " : "") + json_string(byte_char(b)) + ": " + std::to_string(b);
  expect_corrupt(v, "encoder.json", json + "}", "<|endoftext|>");
}

TEST(Gpt2TokenizerLoad, CorruptVocabBpe) {
  const MiniVocab v(Merges{{"a", "b"}});
  expect_corrupt(v, "vocab.bpe", "a b\n", "#version");
  expect_corrupt(v, "vocab.bpe", "#version: 0.2\na b c\n", "line 2");
  expect_corrupt(v, "vocab.bpe", "#version: 0.2\na b\nx y\n", "line 3");  // "xy" is no token
}

// ------------------------------------------------------------ the real GPT-2 files

class Gpt2 : public ::testing::Test {
 protected:
  void SetUp() override {
    BT_NEED_FETCHED(dir() + "/encoder.json", "tokenizer");
    BT_NEED_FETCHED(dir() + "/vocab.bpe", "tokenizer");
    if (!tok_) tok_ = std::make_unique<Gpt2Tokenizer>(Gpt2Tokenizer::load(dir()));
  }
  static std::string dir() { return test::data_dir() + "/tokenizer"; }
  const Gpt2Tokenizer& tok() const { return *tok_; }
  static std::unique_ptr<Gpt2Tokenizer> tok_;
};
std::unique_ptr<Gpt2Tokenizer> Gpt2::tok_;

using Ids = std::vector<int32_t>;

TEST_F(Gpt2, KnownIds) {
  EXPECT_EQ(tok().vocab_size(), 50257);
  EXPECT_EQ(tok().eot(), 50256);
  EXPECT_EQ(tok().encode("Hello world"), (Ids{15496, 995}));
  EXPECT_EQ(tok().encode("Hello, world!"), (Ids{15496, 11, 995, 0}));
  EXPECT_EQ(tok().encode(" the"), (Ids{262}));
  EXPECT_EQ(tok().encode("It's"), (Ids{1026, 338}));
  EXPECT_EQ(tok().encode("\n"), (Ids{198}));
  EXPECT_EQ(tok().encode("\n\n"), (Ids{628}));
  EXPECT_EQ(tok().encode("a\n\nb"), (Ids{64, 198, 198, 65}));  // "\n\n" before text is two pieces
  EXPECT_EQ(tok().encode("hello  world"), (Ids{31373, 220, 995}));
  // The end-of-text marker in text is ordinary text.
  EXPECT_EQ(tok().encode("<|endoftext|>"), (Ids{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(tok().encode(""), Ids{});
}

TEST_F(Gpt2, DecodesSingleTokensAndRejectsBadIds) {
  EXPECT_EQ(tok().decode(15496), "Hello");
  EXPECT_EQ(tok().decode(995), " world");
  EXPECT_EQ(tok().decode(50256), "<|endoftext|>");
  EXPECT_EQ(tok().decode(Ids{15496, 995}), "Hello world");
  const std::string msg = test::error_message([&] { tok().decode(50257); });
  EXPECT_NE(msg.find("50257"), std::string::npos) << msg;
  EXPECT_THROW(tok().decode(-1), Error);
  EXPECT_THROW(tok().decode(Ids{1, 2, 99999}), Error);
}

// Random valid UTF-8 from a mix of scripts, spaces and punctuation.
std::string random_text(std::mt19937& rng, int chars) {
  static const std::vector<std::pair<char32_t, char32_t>> pools = {
      {0x20, 0x7E},     {0x20, 0x20},     {0x9, 0xD},       {0xA0, 0xFF},       {0x370, 0x3FF},
      {0x400, 0x4FF},   {0x300, 0x36F},   {0x590, 0x5FF},   {0x600, 0x6FF},     {0x3040, 0x30FF},
      {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3}, {0x2000, 0x206F}, {0x1F300, 0x1F64F}, {0x10000, 0x1007F},
      {0xE000, 0xF8FF}, {0xFFF0, 0xFFFF}, {0x1, 0x1F}};
  std::string s;
  for (int i = 0; i < chars; ++i) {
    const auto [lo, hi] = pools[rng() % pools.size()];
    unicode::append_utf8(s, lo + rng() % (hi - lo + 1));
  }
  return s;
}

TEST_F(Gpt2, DecodeInvertsEncodeOnValidUtf8) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    const std::string s = random_text(rng, static_cast<int>(rng() % 200));
    ASSERT_TRUE(unicode::is_valid_utf8(s));
    ASSERT_EQ(tok().decode(tok().encode(s)), s) << "trial " << trial;
  }
}

TEST_F(Gpt2, InvalidUtf8EncodesAsReplacementCharacters) {
  EXPECT_EQ(tok().encode("a\xFF"
                         "b"),
            tok().encode("a\uFFFD"
                         "b"));
  std::mt19937 rng(99);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s(rng() % 100, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    ASSERT_EQ(tok().decode(tok().encode(s)), unicode::sanitize_utf8(s)) << "trial " << trial;
  }
}

TEST_F(Gpt2, LongWordsRoundTrip) {
  std::mt19937 rng(5);
  std::string letters, digits;
  for (int i = 0; i < 100000; ++i) letters += static_cast<char>('a' + rng() % 26);
  for (int i = 0; i < 100000; ++i) digits += static_cast<char>('0' + rng() % 10);
  EXPECT_EQ(tok().decode(tok().encode(letters)), letters);
  EXPECT_EQ(tok().decode(tok().encode(digits)), digits);
  EXPECT_EQ(tok().decode(tok().encode(std::string(100000, '='))), std::string(100000, '='));
}

// Encoding the pieces of split_chunks one by one gives encode(whole).
void expect_chunks_encode_alike(const Gpt2Tokenizer& tok, const std::string& text, size_t target) {
  const std::vector<std::string_view> chunks = Gpt2Tokenizer::split_chunks(text, target);
  std::string joined;
  Ids ids;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (i + 1 < chunks.size()) {
      EXPECT_GE(chunks[i].size(), target);
    }
    joined += chunks[i];
    const Ids part = tok.encode(chunks[i]);
    ids.insert(ids.end(), part.begin(), part.end());
  }
  EXPECT_EQ(joined, text);
  EXPECT_EQ(ids, tok.encode(text)) << chunks.size() << " chunks";
}

TEST_F(Gpt2, SplitChunksEncodeLikeTheWhole) {
  std::mt19937 rng(3);
  // Lines that end and start in every way the cut rule must get right.
  const std::vector<std::string> lines = {"word.",   "  indented", "trailing  ", "",      "\t", "x",
                                          "'s",      "é",          "中文",       "1 2 3", "\r", " ",
                                          "a\u00A0", "\u3000b",    "!!",         "\xFF"};
  std::string text;
  for (int i = 0; i < 20000; ++i) text += lines[rng() % lines.size()] + (rng() % 7 ? "\n" : "\n\n");
  for (size_t target : {1, 7, 100, 4096}) expect_chunks_encode_alike(tok(), text, target);

  const std::string jargon = test::data_dir() + "/jargon/jargon.txt";
  BT_NEED_FETCHED(jargon, "jargon");
  std::ifstream f(jargon, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  expect_chunks_encode_alike(tok(), ss.str(), 65536);
}

}  // namespace
}  // namespace bt
