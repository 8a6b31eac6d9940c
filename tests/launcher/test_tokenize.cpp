// `blutrain tokenize`, run as a program: the shards it writes (an EOT before
// each document, the train/val split, shard rollover, stale shards removed)
// hold exactly Gpt2Tokenizer::encode of the inputs; bad arguments fail with
// messages that name them.

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <sys/wait.h>

#include "runtime/data/bpe.h"
#include "runtime/data/shard.h"
#include "tests/support/fetched_data.h"
#include "tests/support/files.h"
#include "tests/support/paths.h"
#include "tests/support/temp_dir.h"

namespace bt {
namespace {

namespace fs = std::filesystem;
using Tokens = std::vector<uint16_t>;

struct Result {
  int rc;
  std::string out, err;
};

class TokenizeCmd : public ::testing::Test {
 protected:
  // Runs `blutrain tokenize ARGS` (ARGS already quoted as needed).
  Result tokenize(const std::string& args) {
    const std::string out = tmp_.file("stdout"), err = tmp_.file("stderr");
    const std::string cmd = test::shell_quote(test::blutrain_exe()) + " tokenize " + args + " >" +
                            test::shell_quote(out) + " 2>" + test::shell_quote(err);
    const int status = std::system(cmd.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, test::read_file(out), test::read_file(err)};
  }

  // Writes a document of about `words` words and returns its path.
  std::string write_doc(const std::string& name, int words, unsigned seed) {
    static const std::vector<std::string> vocab = {
        "the", "hacker", "kludge", "it's", "don't", "42",    "3.14", "naïve", "日本",  "😀",
        "!",   "\n",     "\n\n",   "  ",   "foo()", "\"q\"", "'s",   "UNIX",  "Jargon"};
    std::mt19937 rng(seed);
    std::string text;
    for (int i = 0; i < words; ++i) text += vocab[rng() % vocab.size()] + (rng() % 4 ? " " : "");
    const std::string path = tmp_.file(name);
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  // The tokens of a document as the shards must hold them: EOT, then encode().
  Tokens doc_tokens(const Gpt2Tokenizer& tok, const std::string& path) {
    Tokens t{static_cast<uint16_t>(tok.eot())};
    for (int32_t id : tok.encode(test::read_file(path))) t.push_back(static_cast<uint16_t>(id));
    return t;
  }

  // All tokens of PREFIX_split_*.bin in order; `shards` gets their sizes.
  Tokens read_split(const std::string& prefix, const std::string& split,
                    std::vector<int64_t>* shards = nullptr) {
    Tokens all;
    for (int i = 0;; ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "_%s_%06d.bin", split.c_str(), i);
      if (!fs::exists(prefix + name)) break;
      const ShardInfo info = read_shard_header(prefix + name);
      if (shards) shards->push_back(info.num_tokens);
      const Tokens t = read_shard_tokens(info);
      all.insert(all.end(), t.begin(), t.end());
    }
    return all;
  }

  static std::string tokenizer_dir() { return test::data_dir() + "/tokenizer"; }
  const Gpt2Tokenizer& tok() {
    if (!tok_) tok_ = std::make_unique<Gpt2Tokenizer>(Gpt2Tokenizer::load(tokenizer_dir()));
    return *tok_;
  }
  std::string tok_arg() const { return " --tokenizer " + test::shell_quote(tokenizer_dir()); }

  test::TempDir tmp_{"bt_tokenize_test"};
  std::unique_ptr<Gpt2Tokenizer> tok_;
};

Tokens cat(std::initializer_list<Tokens> parts) {
  Tokens all;
  for (const Tokens& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

#define NEED_TOKENIZER() BT_NEED_FETCHED(tokenizer_dir() + "/encoder.json", "tokenizer")

TEST_F(TokenizeCmd, LastDocumentsGoToVal) {
  NEED_TOKENIZER();
  const std::string a = write_doc("a.txt", 3000, 1), b = write_doc("b.txt", 3000, 2),
                    c = write_doc("c.txt", 600, 3);
  const Tokens ta = doc_tokens(tok(), a), tb = doc_tokens(tok(), b), tc = doc_tokens(tok(), c);
  const std::string prefix = tmp_.file("out/sub/tok");  // folders are created

  // F = 0.1: c alone (about 9% of the tokens) is closest to 10%.
  Result r = tokenize(test::shell_quote(a) + " " + test::shell_quote(b) + " " + test::shell_quote(c) +
                      " -o " + test::shell_quote(prefix) + tok_arg());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(read_split(prefix, "train"), cat({ta, tb}));
  EXPECT_EQ(read_split(prefix, "val"), tc);
  EXPECT_NE(r.out.find("3 documents"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(std::to_string(ta.size() + tb.size() + tc.size()) + " tokens"), std::string::npos)
      << r.out;

  // F = 0.5: b and c (about 55%) are closer to half than c alone.
  r = tokenize(test::shell_quote(a) + " " + test::shell_quote(b) + " " + test::shell_quote(c) + " -o " +
               test::shell_quote(prefix) + " --val-fraction 0.5" + tok_arg());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(read_split(prefix, "train"), ta);
  EXPECT_EQ(read_split(prefix, "val"), cat({tb, tc}));
}

TEST_F(TokenizeCmd, OneDocumentKeepsItsTailForVal) {
  NEED_TOKENIZER();
  const std::string a = write_doc("a.txt", 2000, 4);
  const Tokens t = doc_tokens(tok(), a);  // EOT + n tokens
  const auto n = static_cast<int64_t>(t.size() - 1);
  const auto v = static_cast<int64_t>(std::llround(0.25 * static_cast<double>(n)));
  const std::string prefix = tmp_.file("one");
  const Result r = tokenize(test::shell_quote(a) + " -o " + test::shell_quote(prefix) +
                            " --val-fraction 0.25" + tok_arg());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(read_split(prefix, "train"), Tokens(t.begin(), t.end() - v));
  EXPECT_EQ(read_split(prefix, "val"), cat({Tokens{t[0]}, Tokens(t.end() - v, t.end())}));
}

// scripts/prepare-jargon (the quick start's data step): the layout goes --
// table art, indentation, wrapped lines, blank lines -- and the shards hold
// exactly the tokens of what is left.
TEST_F(TokenizeCmd, PrepareJargonScriptJoinsParagraphs) {
  NEED_TOKENIZER();
  const std::string data = tmp_.file("data");
  fs::create_directories(data + "/jargon");
  fs::create_directory_symlink(fs::absolute(tokenizer_dir()), data + "/tokenizer");
  std::ofstream(data + "/jargon/jargon.txt", std::ios::binary)
      << "                         The Jargon File\n"
         "   \u250c\u2500\u2500\u2500\u252c\u2500\u2500\u2500\u2510\n"
         "   \u2502 a \u2502 b \u2502\n"
         "   \u2514\u2500\u2500\u2500\u2534\u2500\u2500\u2500\u2518\n"
         "\n"
         "   :goat file:\n"
         "   \n"
         "   A sacrificial file used to test a computer virus, i.e. a dummy executable\n"
         "   that carries   a sample. \n"
         "\n\n";
  const std::string cmd = "DATA_DIR=" + test::shell_quote(data) + " " +
                          test::shell_quote(test::source_dir() + "/scripts/prepare-jargon") + " " +
                          test::shell_quote(test::blutrain_exe()) + " >" +
                          test::shell_quote(tmp_.file("prep.log")) + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << test::read_file(tmp_.file("prep.log"));

  const std::string prose = test::read_file(data + "/jargon/prose.txt");
  EXPECT_EQ(
      prose,
      "The Jargon File\n:goat file:\n"
      "A sacrificial file used to test a computer virus, i.e. a dummy executable that carries a sample.\n");
  const Tokens t = doc_tokens(tok(), data + "/jargon/prose.txt");
  const std::string prefix = data + "/jargon/tok/prose";
  Tokens train = read_split(prefix, "train"), val = read_split(prefix, "val");
  ASSERT_FALSE(val.empty());
  EXPECT_EQ(val[0], t[0]) << "the validation shard starts with EOT";
  train.insert(train.end(), val.begin() + 1, val.end());
  EXPECT_EQ(train, t);

  // A second run leaves the fresh shards alone.
  ASSERT_EQ(std::system(cmd.c_str()), 0) << test::read_file(tmp_.file("prep.log"));
  EXPECT_NE(test::read_file(tmp_.file("prep.log")).find("up to date"), std::string::npos)
      << test::read_file(tmp_.file("prep.log"));
}

TEST_F(TokenizeCmd, ShardsRollOverAndStaleOnesGo) {
  NEED_TOKENIZER();
  const std::string a = write_doc("a.txt", 700, 5), b = write_doc("b.txt", 500, 6);
  const Tokens all = cat({doc_tokens(tok(), a), doc_tokens(tok(), b)});
  const std::string prefix = tmp_.file("roll");
  Result r = tokenize(test::shell_quote(a) + " " + test::shell_quote(b) + " -o " + test::shell_quote(prefix) +
                      " --val-fraction 0 --shard-tokens 100" + tok_arg());
  ASSERT_EQ(r.rc, 0) << r.err;
  std::vector<int64_t> sizes;
  EXPECT_EQ(read_split(prefix, "train", &sizes), all);
  ASSERT_EQ(sizes.size(), (all.size() + 99) / 100);
  for (size_t i = 0; i + 1 < sizes.size(); ++i) EXPECT_EQ(sizes[i], 100);
  EXPECT_EQ(sizes.back(), static_cast<int64_t>(all.size() - 100 * (sizes.size() - 1)));
  EXPECT_FALSE(fs::exists(prefix + "_val_000000.bin"));

  // A second run with bigger shards leaves only its own shards behind.
  r = tokenize(test::shell_quote(a) + " " + test::shell_quote(b) + " -o " + test::shell_quote(prefix) +
               " --val-fraction 0 --shard-tokens 1000000" + tok_arg());
  ASSERT_EQ(r.rc, 0) << r.err;
  sizes.clear();
  EXPECT_EQ(read_split(prefix, "train", &sizes), all);
  EXPECT_EQ(sizes.size(), 1u);
  EXPECT_FALSE(fs::exists(prefix + "_train_000001.bin"));
  EXPECT_EQ(expand_glob(prefix + "_*.bin").size(), 1u);
}

TEST_F(TokenizeCmd, MissingTokenizerSaysToFetch) {
  const std::string a = write_doc("a.txt", 10, 7);
  const Result r = tokenize(test::shell_quote(a) + " -o " + test::shell_quote(tmp_.file("x")) +
                            " --tokenizer " + test::shell_quote(tmp_.file("no_tokenizer")));
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("scripts/fetch-data tokenizer"), std::string::npos) << r.err;
}

TEST_F(TokenizeCmd, BadInputsFailNamingThem) {
  const std::string a = write_doc("a.txt", 10, 8);
  const std::string out = " -o " + test::shell_quote(tmp_.file("x"));
  const std::string missing = tmp_.file("missing.txt");
  Result r = tokenize(test::shell_quote(a) + " " + test::shell_quote(missing) + out);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find(missing), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;

  r = tokenize(test::shell_quote(tmp_.path().string()) + out);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("is a folder"), std::string::npos) << r.err;

  r = tokenize(out);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("input"), std::string::npos) << r.err;

  r = tokenize(test::shell_quote(a));
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("-o PREFIX"), std::string::npos) << r.err;
}

TEST_F(TokenizeCmd, BadOptionsFailNamingThem) {
  const std::string a = write_doc("a.txt", 10, 9);
  const std::string base = test::shell_quote(a) + " -o " + test::shell_quote(tmp_.file("x"));
  for (const char* f : {"1", "1.5", "-0.1", "abc", "0.2x", "nan"}) {
    const Result r = tokenize(base + " --val-fraction " + f);
    EXPECT_NE(r.rc, 0) << f;
    EXPECT_NE(r.err.find("--val-fraction"), std::string::npos) << f << ": " << r.err;
  }
  for (const char* n : {"0", "-5", "x", "3000000000"}) {
    const Result r = tokenize(base + " --shard-tokens " + n);
    EXPECT_NE(r.rc, 0) << n;
    EXPECT_NE(r.err.find("--shard-tokens"), std::string::npos) << n << ": " << r.err;
  }
}

TEST_F(TokenizeCmd, UnwritableOutputFails) {
  const std::string a = write_doc("a.txt", 10, 10);
  // A prefix under a regular file: no folder can be made there, even as root.
  const std::string prefix = a + "/sub/tok";
  const Result r = tokenize(test::shell_quote(a) + " -o " + test::shell_quote(prefix));
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("output folder"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(a + "/sub"), std::string::npos) << r.err;
}

TEST_F(TokenizeCmd, HelpListsTheOptions) {
  const Result r = tokenize("--help");
  EXPECT_EQ(r.rc, 0);
  for (const char* o : {"--val-fraction", "--shard-tokens", "--tokenizer", "--output"})
    EXPECT_NE(r.out.find(o), std::string::npos) << o << "\n" << r.out;
}

}  // namespace
}  // namespace bt
