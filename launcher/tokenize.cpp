// `blutrain tokenize INPUT... -o PREFIX`: GPT-2-tokenizes text files into
// llm.c token shards (runtime/data/shard.h) that `blutrain train` and
// TokenLoader read.
//
// Each input file is one document, and <|endoftext|> (50256) goes before each
// document. The validation split (--val-fraction F, default 0.1) is:
//   - with two or more documents, the last k documents (1 <= k < count) whose
//     tokens are closest to F of all tokens (ties: fewer documents);
//   - with one document, the last round(F n) of its n tokens (at least 1,
//     at most n - 1), after an <|endoftext|> of their own;
//   - with F = 0, nothing: every token goes to train.
// Shards of at most --shard-tokens tokens are written as PREFIX_val_000000.bin,
// ... then PREFIX_train_000000.bin, ...; shards of an earlier run with the
// same PREFIX and higher numbers are removed, so PREFIX_*.bin is this run.
// All tokens are held in memory (2 bytes each) until the split is known.
// Documents are cut at safe places (Gpt2Tokenizer::split_chunks) into ~1 MB
// pieces that --threads workers encode in parallel.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "kernels/common/error.h"
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "runtime/data/bpe.h"
#include "runtime/data/shard.h"

namespace bt::launcher {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr size_t kChunkBytes = size_t{1} << 20;   // piece of a document one worker encodes
constexpr size_t kBatchBytes = size_t{64} << 20;  // text read into memory at a time

struct Options {
  std::vector<std::string> inputs;
  std::string prefix, tokenizer;
  double val_fraction = 0.1;
  int64_t shard_tokens = 100'000'000;
  int threads = 1;
};

// Parses all of `s` as a T, or fails naming the option.
template <typename T>
T parse_number(const std::string& s, const char* option, const char* want) {
  std::istringstream is(s);
  T v{};
  is >> v;
  BT_CHECK(is && is.peek() == std::char_traits<char>::eof(), "", option, " must be ", want, ", got '", s,
           "'");
  return v;
}

Options parse(int argc, char** argv) {
  cli::Options opts("blutrain tokenize",
                    "GPT-2-tokenize text files (one document each, <|endoftext|> before each) into llm.c "
                    "token shards PREFIX_val_NNNNNN.bin and PREFIX_train_NNNNNN.bin.");
  opts.positional_help("INPUT... -o PREFIX");
  opts.add_options()("o,output", "output prefix, e.g. data/shards/jargon", cli::value<std::string>())(
      "val-fraction",
      "share of tokens for validation, in [0, 1): the last documents, or the tail of a single one",
      cli::value<std::string>()->default_value("0.1"))("shard-tokens", "tokens per shard at most",
                                                       cli::value<std::string>()->default_value("100000000"))(
      "tokenizer", "folder with encoder.json and vocab.bpe (scripts/fetch-data tokenizer)",
      cli::value<std::string>()->default_value("data/tokenizer"))(
      "threads", "encoding threads, 0 = one per core", cli::value<std::string>()->default_value("0"))(
      "inputs", "text files", cli::value<std::vector<std::string>>())("h,help", "show this help");
  opts.parse_positional({"inputs"});
  cli::ParseResult r;
  try {
    r = opts.parse(argc, argv);
  } catch (const std::exception& e) {
    BT_FAIL(e.what(), " (see blutrain tokenize --help)");
  }
  if (r.count("help")) {
    std::printf("%s\n", opts.help().c_str());
    std::exit(0);
  }
  Options o;
  BT_CHECK(r.count("inputs"), "give at least one input text file (see blutrain tokenize --help)");
  BT_CHECK(r.count("output"), "give the output prefix with -o PREFIX, e.g. -o data/shards/jargon");
  o.inputs = r["inputs"].as<std::vector<std::string>>();
  o.prefix = r["output"].as<std::string>();
  o.tokenizer = r["tokenizer"].as<std::string>();
  o.val_fraction =
      parse_number<double>(r["val-fraction"].as<std::string>(), "--val-fraction", "a number in [0, 1)");
  BT_CHECK(o.val_fraction >= 0 && o.val_fraction < 1, "--val-fraction must be in [0, 1), got ",
           o.val_fraction);
  o.shard_tokens = parse_number<int64_t>(r["shard-tokens"].as<std::string>(), "--shard-tokens", "an integer");
  BT_CHECK(o.shard_tokens > 0 && o.shard_tokens <= std::numeric_limits<int32_t>::max(),
           "--shard-tokens must be in [1, 2^31 - 1] (the shard header holds an int32 count), got ",
           o.shard_tokens);
  const int threads = parse_number<int>(r["threads"].as<std::string>(), "--threads", "an integer");
  BT_CHECK(threads >= 0, "--threads must be >= 0 (0: all cores), got ", threads);
  o.threads = threads > 0 ? threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return o;
}

// ------------------------------------------------------------ output

std::string shard_path(const std::string& prefix, const char* split, int index) {
  char num[16];
  std::snprintf(num, sizeof num, "%06d", index);
  return prefix + "_" + split + "_" + num + ".bin";
}

// Creates PREFIX's folder and checks that a file can be written there.
void prepare_output(const std::string& prefix) {
  const fs::path p(prefix);
  BT_CHECK(!p.filename().empty() && p.filename() != "." && p.filename() != "..", "-o '", prefix,
           "' must end with a file name prefix, e.g. -o ", (p / "shards").lexically_normal().string());
  const fs::path dir = p.parent_path();
  if (!dir.empty()) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    BT_CHECK(!ec && fs::is_directory(dir), "cannot create the output folder '", dir.string(), "' (",
             ec ? ec.message() : "not a folder", "); pass -o with a prefix in a writable folder");
  }
  const std::string probe = prefix + "_probe.tmp";
  {
    std::ofstream f(probe, std::ios::binary);
    BT_CHECK(f, "cannot write in the output folder of '", prefix,
             "'; pass -o with a prefix in a writable folder");
  }
  std::error_code ec;
  fs::remove(probe, ec);
}

// Collects one split's tokens and writes a shard each time it is full.
class ShardSink {
 public:
  ShardSink(std::string prefix, const char* split, int64_t shard_tokens)
      : prefix_(std::move(prefix)), split_(split), cap_(static_cast<size_t>(shard_tokens)) {}

  void append(const uint16_t* p, size_t n) {
    while (n > 0) {
      const size_t take = std::min(n, cap_ - buf_.size());
      buf_.insert(buf_.end(), p, p + take);
      p += take;
      n -= take;
      if (buf_.size() == cap_) flush();
    }
  }
  void finish() {
    if (!buf_.empty()) flush();
  }
  int shards() const { return shards_; }
  int64_t tokens() const { return tokens_; }

 private:
  void flush() {
    write_shard(shard_path(prefix_, split_, shards_++), buf_);
    tokens_ += static_cast<int64_t>(buf_.size());
    buf_.clear();
  }
  std::string prefix_;
  const char* split_;
  size_t cap_;
  std::vector<uint16_t> buf_;
  int shards_ = 0;
  int64_t tokens_ = 0;
};

// Removes PREFIX_{split}_NNNNNN.bin with NNNNNN >= kept (left by an earlier run).
int remove_stale_shards(const std::string& prefix, const char* split, int kept) {
  const fs::path p(prefix);
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  const std::string head = p.filename().string() + "_" + split + "_";
  int removed = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() != head.size() + 10 || !name.starts_with(head) || !name.ends_with(".bin")) continue;
    const std::string num = name.substr(head.size(), 6);
    if (!std::all_of(num.begin(), num.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    if (std::stoi(num) < kept) continue;
    std::error_code rm;
    if (fs::remove(e.path(), rm)) {
      std::fprintf(stderr, "tokenize: removed %s (a shard of an earlier run)\n", e.path().c_str());
      ++removed;
    }
  }
  return removed;
}

// ------------------------------------------------------------ encoding

struct Document {
  std::string path;
  uint64_t bytes = 0;
  std::vector<uint16_t> tokens;
};

class Progress {
 public:
  explicit Progress(uint64_t total_bytes) : total_(total_bytes), tty_(::isatty(2)) {}
  std::atomic<uint64_t> bytes{0}, tokens{0};

  // Prints a progress line when one is due (every 0.5 s on a terminal, 5 s otherwise).
  void maybe_print() {
    const double t = elapsed();
    if (t < next_) return;
    next_ = t + (tty_ ? 0.5 : 5.0);
    const double mb = bytes.load() / 1e6;
    std::fprintf(stderr, "%stokenize: %.1f / %.1f MB (%.0f%%), %.2f MB/s, %.2fM tokens, %.0f s%s",
                 tty_ ? "\r" : "", mb, total_ / 1e6, total_ ? 100.0 * bytes.load() / total_ : 100.0, mb / t,
                 tokens.load() / 1e6, t, tty_ ? "  " : "\n");
    std::fflush(stderr);
    printed_ = true;
  }
  void end() {
    if (printed_ && tty_) std::fprintf(stderr, "\n");
  }
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  uint64_t total_;
  bool tty_;
  Clock::time_point start_ = Clock::now();
  double next_ = 0.5;
  bool printed_ = false;
};

std::string read_input(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  BT_CHECK(f, "cannot read input '", path, "'; check that it exists and is readable");
  std::ostringstream ss;
  ss << f.rdbuf();
  BT_CHECK(!f.bad(), "error while reading input '", path, "'");
  return ss.str();
}

// Encodes docs[first, last) with `threads` workers, filling their tokens.
void encode_batch(const Gpt2Tokenizer& tok, std::vector<Document>& docs, size_t first, size_t last,
                  int threads, Progress& progress) {
  std::vector<std::string> texts;
  struct Piece {
    size_t doc;
    std::string_view text;
  };
  std::vector<Piece> pieces;
  texts.reserve(last - first);
  for (size_t d = first; d < last; ++d) texts.push_back(read_input(docs[d].path));
  for (size_t d = first; d < last; ++d)
    for (std::string_view c : Gpt2Tokenizer::split_chunks(texts[d - first], kChunkBytes))
      pieces.push_back({d, c});

  std::vector<std::vector<int32_t>> out(pieces.size());
  std::atomic<size_t> next{0}, done{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < pieces.size();) {
      try {
        out[i] = tok.encode(pieces[i].text);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
      }
      progress.bytes += pieces[i].text.size();
      progress.tokens += out[i].size();
      done.fetch_add(1);
    }
  };
  std::vector<std::thread> pool;
  const size_t n_workers = std::min<size_t>(static_cast<size_t>(threads), pieces.size());
  for (size_t w = 0; w < n_workers; ++w) pool.emplace_back(work);
  while (done.load() < pieces.size()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    progress.maybe_print();
  }
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);

  for (size_t i = 0; i < pieces.size(); ++i) {
    std::vector<uint16_t>& dst = docs[pieces[i].doc].tokens;
    dst.insert(dst.end(), out[i].begin(), out[i].end());  // ids < vocab_size() <= 65536
    std::vector<int32_t>().swap(out[i]);
  }
}

// Number of trailing documents for validation (see the top of this file).
size_t val_documents(const std::vector<Document>& docs, double f) {
  int64_t total = 0;
  for (const Document& d : docs) total += 1 + static_cast<int64_t>(d.tokens.size());
  const double target = f * static_cast<double>(total);
  size_t best = 1;
  double best_err = std::numeric_limits<double>::infinity();
  int64_t suffix = 0;
  for (size_t k = 1; k < docs.size(); ++k) {
    suffix += 1 + static_cast<int64_t>(docs[docs.size() - k].tokens.size());
    const double err = std::abs(static_cast<double>(suffix) - target);
    if (err < best_err) {
      best_err = err;
      best = k;
    }
  }
  return best;
}

}  // namespace

int run_tokenize(int argc, char** argv) {
  const Clock::time_point start = Clock::now();
  const Options o = parse(argc, argv);

  // Check everything the user can get wrong before the long part.
  std::vector<Document> docs;
  uint64_t total_bytes = 0;
  for (const std::string& path : o.inputs) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    BT_CHECK(fs::exists(st), "input '", path, "' does not exist");
    BT_CHECK(!fs::is_directory(st), "input '", path, "' is a folder; pass the files in it (e.g. ", path,
             "/*.txt)");
    BT_CHECK(std::ifstream(path, std::ios::binary).good(), "cannot read input '", path,
             "'; check its permissions");
    const uint64_t size = fs::is_regular_file(st) ? fs::file_size(path, ec) : 0;
    docs.push_back({path, ec ? 0 : size, {}});
    total_bytes += docs.back().bytes;
  }
  prepare_output(o.prefix);
  const Gpt2Tokenizer tok = Gpt2Tokenizer::load(o.tokenizer);
  BT_CHECK(tok.vocab_size() <= 65536, "the tokenizer in '", o.tokenizer, "' has ", tok.vocab_size(),
           " tokens, but shards store uint16 ids (at most 65536 tokens)");

  Progress progress(total_bytes);
  for (size_t first = 0; first < docs.size();) {
    size_t last = first;
    uint64_t batch = 0;
    while (last < docs.size() && (last == first || batch + docs[last].bytes <= kBatchBytes))
      batch += docs[last++].bytes;
    encode_batch(tok, docs, first, last, o.threads, progress);
    first = last;
  }
  progress.end();

  // Split: documents [0, n_train) go to train, the rest to val; a single
  // document keeps its last `tail` tokens for val.
  size_t n_train = docs.size();
  int64_t tail = 0;
  std::string split_note = "no validation split";
  if (o.val_fraction > 0 && docs.size() >= 2) {
    const size_t k = val_documents(docs, o.val_fraction);
    n_train = docs.size() - k;
    split_note = bt::cat("val = the last ", k, k == 1 ? " document" : " documents");
  } else if (o.val_fraction > 0) {
    const auto n = static_cast<int64_t>(docs[0].tokens.size());
    BT_CHECK(n >= 2, "'", docs[0].path, "' has ", n,
             " token(s), too few to split off a validation part; pass --val-fraction 0");
    tail = std::clamp<int64_t>(std::llround(o.val_fraction * static_cast<double>(n)), 1, n - 1);
    split_note = bt::cat("val = the last ", tail, tail == 1 ? " token" : " tokens", " of the document");
  }

  // Write val first (llm.c order), then train; each document after an EOT.
  const uint16_t eot = static_cast<uint16_t>(tok.eot());
  ShardSink val(o.prefix, "val", o.shard_tokens), train(o.prefix, "train", o.shard_tokens);
  for (size_t d = n_train; d < docs.size(); ++d) {
    val.append(&eot, 1);
    val.append(docs[d].tokens.data(), docs[d].tokens.size());
  }
  if (tail > 0) {
    val.append(&eot, 1);
    val.append(docs[0].tokens.data() + docs[0].tokens.size() - tail, static_cast<size_t>(tail));
  }
  val.finish();
  for (size_t d = 0; d < n_train; ++d) {
    train.append(&eot, 1);
    train.append(docs[d].tokens.data(), docs[d].tokens.size() - static_cast<size_t>(tail));
  }
  train.finish();
  remove_stale_shards(o.prefix, "val", val.shards());
  remove_stale_shards(o.prefix, "train", train.shards());

  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf(
      "tokenize: %zu document%s, %.2f MB -> %lld tokens (train %lld, val %lld; %s), %d shard%s "
      "(%d val, %d train) at %s_{val,train}_*.bin, %.2f s (%.2f MB/s)\n",
      docs.size(), docs.size() == 1 ? "" : "s", total_bytes / 1e6,
      static_cast<long long>(train.tokens() + val.tokens()), static_cast<long long>(train.tokens()),
      static_cast<long long>(val.tokens()), split_note.c_str(), val.shards() + train.shards(),
      val.shards() + train.shards() == 1 ? "" : "s", val.shards(), train.shards(), o.prefix.c_str(), secs,
      total_bytes / 1e6 / std::max(secs, 1e-9));
  return 0;
}

}  // namespace bt::launcher
