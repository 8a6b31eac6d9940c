#include "runtime/data/bpe.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <functional>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "kernels/common/error.h"
#include "runtime/data/unicode.h"

namespace bt {
namespace {

using unicode::CharClass;

constexpr const char* kFetchHint = "run `scripts/fetch-data tokenizer` to fetch the GPT-2 tokenizer files";
constexpr size_t kMaxCachedWords = size_t{1} << 18;
constexpr size_t kMaxCachedWordBytes = 256;

// ------------------------------------------------------------ files

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  BT_CHECK(f, "GPT-2 tokenizer: cannot open '", path, "'; ", kFetchHint,
           " (into data/tokenizer/), or pass the folder that holds encoder.json and vocab.bpe");
  std::ostringstream ss;
  ss << f.rdbuf();
  BT_CHECK(!f.bad(), "GPT-2 tokenizer: cannot read '", path, "'; ", kFetchHint);
  return ss.str();
}

// GPT-2's bytes_to_unicode(): printable bytes stand for themselves, the other
// 68 bytes for U+0100.. in byte order. Token strings in encoder.json and
// vocab.bpe are written in these characters.
std::array<char32_t, 256> byte_to_char() {
  std::array<char32_t, 256> m{};
  char32_t n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    m[b] = printable ? static_cast<char32_t>(b) : 256 + n++;
  }
  return m;
}

// A token string in byte_to_char() characters -> its raw bytes; false when a
// character is not one of them (or the string is empty or not UTF-8).
bool token_to_bytes(std::string_view s, std::string& out) {
  static const auto inverse = [] {
    std::array<int, 512> inv;
    inv.fill(-1);
    const auto fwd = byte_to_char();
    for (int b = 0; b < 256; ++b) inv[fwd[b]] = b;
    return inv;
  }();
  out.clear();
  const char* p = s.data();
  const char* end = p + s.size();
  while (p < end) {
    const unicode::Utf8Char c = unicode::decode_utf8(p, end);
    if (!c.valid || c.cp >= inverse.size() || inverse[c.cp] < 0) return false;
    out += static_cast<char>(inverse[c.cp]);
    p += c.len;
  }
  return !out.empty();
}

// ------------------------------------------------------------ pre-tokenizer

struct Cls {
  CharClass cls;
  int len;
};

inline Cls classify_at(const char* p, const char* end) {
  static const auto ascii = [] {
    std::array<CharClass, 128> t{};
    for (char32_t c = 0; c < 128; ++c) t[c] = unicode::char_class(c);
    return t;
  }();
  const auto b = static_cast<unsigned char>(*p);
  if (b < 0x80) return {ascii[b], 1};
  const unicode::Utf8Char c = unicode::decode_utf8(p, end);
  return {unicode::char_class(c.cp), c.len};
}

// Calls emit(piece) for each match of
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// in order. Alternatives are tried first to last at each position, as in JS.
template <typename Emit>
void scan(std::string_view text, Emit&& emit) {
  const char* p = text.data();
  const char* const end = p + text.size();
  while (p < end) {
    // 's 't 're 've 'm 'll 'd (lower case only, as in the regex)
    if (*p == '\'' && end - p >= 2) {
      const char a = p[1];
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        emit(std::string_view(p, 2));
        p += 2;
        continue;
      }
      if (end - p >= 3) {
        const char b = p[2];
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
          emit(std::string_view(p, 3));
          p += 3;
          continue;
        }
      }
    }
    const Cls c = classify_at(p, end);
    CharClass run = c.cls;
    const char* q = p + c.len;
    if (*p == ' ' && q < end) {  // " ?" followed by a letter, number or other run
      const Cls d = classify_at(q, end);
      if (d.cls != CharClass::Space) {
        run = d.cls;
        q += d.len;
      }
    }
    if (run != CharClass::Space) {  // ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+
      while (q < end) {
        const Cls d = classify_at(q, end);
        if (d.cls != run) break;
        q += d.len;
      }
    } else {  // \s+(?!\S) | \s+
      const char* last = p;
      while (q < end) {
        const Cls d = classify_at(q, end);
        if (d.cls != CharClass::Space) break;
        last = q;
        q += d.len;
      }
      // Followed by a non-space: \s+(?!\S) backs off one character, leaving
      // it to start the next match (" word"); a single space falls to \s+.
      if (q < end && last != p) q = last;
    }
    emit(std::string_view(p, static_cast<size_t>(q - p)));
    p = q;
  }
}

// ------------------------------------------------------------ word cache

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct WordCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>> index;
  std::vector<int32_t> ids;  // index values are (offset, count) into ids
  void reset(uint64_t new_owner) {
    owner = new_owner;
    index.clear();
    ids.clear();
  }
};

thread_local WordCache tl_cache;
std::atomic<uint64_t> next_instance{1};

}  // namespace

// ------------------------------------------------------------ load

Gpt2Tokenizer Gpt2Tokenizer::load(const std::string& dir) {
  Gpt2Tokenizer t;
  t.instance_ = next_instance.fetch_add(1);
  const std::string enc_path = dir + "/encoder.json";
  const std::string bpe_path = dir + "/vocab.bpe";

  // encoder.json: {"token": id, ...} with ids 0..n-1, each once.
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(enc_path));
  } catch (const nlohmann::json::exception& e) {
    BT_FAIL("GPT-2 tokenizer: '", enc_path, "' is not valid JSON (", e.what(), "); ", kFetchHint, " again");
  }
  BT_CHECK(j.is_object() && !j.empty(), "GPT-2 tokenizer: '", enc_path,
           "' must be a JSON object mapping token strings to ids; ", kFetchHint, " again");
  const size_t n = j.size();
  t.token_bytes_.assign(n, std::string());
  std::vector<bool> seen(n, false);
  std::unordered_map<std::string, int32_t> id_of;  // token string (as in the files) -> id
  id_of.reserve(n);
  std::string bytes;
  for (const auto& [key, value] : j.items()) {
    BT_CHECK(value.is_number_integer() && value.get<int64_t>() >= 0 && value.get<int64_t>() < int64_t(n) &&
                 !seen[value.get<size_t>()],
             "GPT-2 tokenizer: '", enc_path, "': token \"", key, "\" has id ", value.dump(),
             ", but ids must be distinct integers in [0, ", n, "); ", kFetchHint, " again");
    const auto id = value.get<int32_t>();
    BT_CHECK(token_to_bytes(key, bytes), "GPT-2 tokenizer: '", enc_path, "': token \"", key,
             "\" is not written in GPT-2's byte-to-unicode characters; ", kFetchHint, " again");
    seen[id] = true;
    t.token_bytes_[id] = bytes;
    id_of.emplace(key, id);
  }
  const auto fwd = byte_to_char();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    unicode::append_utf8(s, fwd[b]);
    auto it = id_of.find(s);
    BT_CHECK(it != id_of.end(), "GPT-2 tokenizer: '", enc_path, "' lacks the one-byte token for byte ", b,
             "; ", kFetchHint, " again");
    t.byte_id_[b] = it->second;
  }
  auto eot = id_of.find("<|endoftext|>");
  BT_CHECK(eot != id_of.end(), "GPT-2 tokenizer: '", enc_path, "' has no \"<|endoftext|>\" token; ",
           kFetchHint, " again");
  t.eot_ = eot->second;

  // vocab.bpe: "#version: ..." then one "first second" merge per line. Like
  // Encoder.js, the merges are lines[1:-1] of the '\n'-split file.
  const std::string text = read_file(bpe_path);
  std::vector<std::string_view> lines;
  for (size_t pos = 0;;) {
    const size_t nl = text.find('\n', pos);
    lines.emplace_back(text.data() + pos, (nl == std::string::npos ? text.size() : nl) - pos);
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  BT_CHECK(lines.size() >= 2 && lines[0].starts_with("#version"), "GPT-2 tokenizer: '", bpe_path,
           "' must start with a \"#version\" line followed by merges; ", kFetchHint, " again");
  // Encoder.js keys ranks by `first + "," + second`; a later duplicate key wins.
  std::unordered_map<std::string, int32_t> rank_of_key;
  rank_of_key.reserve(lines.size());
  for (size_t i = 1; i + 1 < lines.size(); ++i) {
    std::vector<std::string_view> parts;
    const std::string_view line = lines[i];
    for (size_t k = 0; k < line.size();) {
      const size_t b = line.find_first_not_of(" \t\r\v\f", k);
      if (b == std::string_view::npos) break;
      const size_t e = std::min(line.find_first_of(" \t\r\v\f", b), line.size());
      parts.push_back(line.substr(b, e - b));
      k = e;
    }
    BT_CHECK(parts.size() == 2 && id_of.count(std::string(parts[0])) && id_of.count(std::string(parts[1])) &&
                 id_of.count(std::string(parts[0]) + std::string(parts[1])),
             "GPT-2 tokenizer: '", bpe_path, "' line ", i + 1, " (\"", line.substr(0, 80),
             "\") is not a merge of two tokens of encoder.json into a third; ", kFetchHint, " again");
    rank_of_key[std::string(parts[0]) + "," + std::string(parts[1])] = static_cast<int32_t>(i - 1);
  }
  // Every split of a key at a comma whose halves and join are tokens merges
  // with the key's rank: the merge itself, and the pairs Encoder.js confuses with it.
  for (const auto& [key, rank] : rank_of_key) {
    for (size_t c = key.find(','); c != std::string::npos; c = key.find(',', c + 1)) {
      const std::string a = key.substr(0, c), b = key.substr(c + 1);
      auto ia = id_of.find(a), ib = id_of.find(b), iab = id_of.find(a + b);
      if (ia == id_of.end() || ib == id_of.end() || iab == id_of.end()) continue;
      const uint64_t k = (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
      t.merges_[k] = Merge{rank, iab->second};
    }
  }
  return t;
}

// ------------------------------------------------------------ encode

std::vector<std::string_view> Gpt2Tokenizer::pretokenize(std::string_view text) {
  std::vector<std::string_view> out;
  scan(text, [&](std::string_view w) { out.push_back(w); });
  return out;
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::string clean;
  if (!unicode::is_valid_utf8(text)) {
    clean = unicode::sanitize_utf8(text);
    text = clean;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 16);
  scan(text, [&](std::string_view w) { encode_word(w, out); });
  return out;
}

void Gpt2Tokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() == 1) {
    out.push_back(byte_id_[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (word.size() > kMaxCachedWordBytes) {
    bpe(word, out);
    return;
  }
  WordCache& cache = tl_cache;
  if (cache.owner != instance_) cache.reset(instance_);
  if (auto it = cache.index.find(word); it != cache.index.end()) {
    const auto [off, count] = it->second;
    out.insert(out.end(), cache.ids.begin() + off, cache.ids.begin() + off + count);
    return;
  }
  const size_t before = out.size();
  bpe(word, out);
  if (cache.index.size() >= kMaxCachedWords) cache.reset(instance_);
  cache.index.emplace(std::string(word),
                      std::pair<uint32_t, uint32_t>(static_cast<uint32_t>(cache.ids.size()),
                                                    static_cast<uint32_t>(out.size() - before)));
  cache.ids.insert(cache.ids.end(), out.begin() + static_cast<ptrdiff_t>(before), out.end());
}

// Encoder.js's bpe(): repeatedly take the lowest rank among adjacent pairs;
// among pairs of that rank, the one nearest the end picks the pair (first,
// second), and every occurrence of it in the word is merged left to right.
// The word is a linked list of symbols and the candidate pairs sit in a heap,
// so a long word costs O(n log n) rather than Encoder.js's O(n^2).
void Gpt2Tokenizer::bpe(std::string_view word, std::vector<int32_t>& out) const {
  const int n = static_cast<int>(word.size());
  std::vector<int32_t> id(n);
  std::vector<int> next(n);
  std::vector<int> prev(n);
  std::vector<char> alive(n, 1);
  for (int i = 0; i < n; ++i) {
    id[i] = byte_id_[static_cast<unsigned char>(word[i])];
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    int32_t rank, merged;
    int pos;
    int32_t left, right;
  };
  auto later = [](const Cand& x, const Cand& y) { return x.rank > y.rank; };  // min-heap on rank
  std::vector<Cand> heap;
  auto push = [&](int p) {
    const int q = next[p];
    if (q < 0) return;
    if (const Merge* m = find_merge(id[p], id[q])) {
      heap.push_back({m->rank, m->merged, p, id[p], id[q]});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  auto valid = [&](const Cand& c) {
    return alive[c.pos] && id[c.pos] == c.left && next[c.pos] >= 0 && id[next[c.pos]] == c.right;
  };
  auto pop = [&] {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Cand c = heap.back();
    heap.pop_back();
    return c;
  };
  for (int i = 0; i + 1 < n; ++i) push(i);

  std::vector<Cand> batch;
  while (!heap.empty()) {
    const Cand top = pop();
    if (!valid(top)) continue;
    batch.assign(1, top);
    while (!heap.empty() && heap.front().rank == top.rank) {
      const Cand c = pop();
      if (valid(c)) batch.push_back(c);
    }
    const Cand pick = *std::max_element(batch.begin(), batch.end(),
                                        [](const Cand& x, const Cand& y) { return x.pos < y.pos; });
    std::sort(batch.begin(), batch.end(), [](const Cand& x, const Cand& y) { return x.pos < y.pos; });
    for (const Cand& c : batch) {
      if (c.left != pick.left || c.right != pick.right) {  // same rank, other pair: next round
        heap.push_back(c);
        std::push_heap(heap.begin(), heap.end(), later);
        continue;
      }
      if (!valid(c)) continue;  // consumed by the previous merge (e.g. "aaa")
      const int p = c.pos, q = next[p];
      id[p] = c.merged;
      alive[q] = 0;
      next[p] = next[q];
      if (next[q] >= 0) prev[next[q]] = p;
      if (prev[p] >= 0) push(prev[p]);
      push(p);
    }
  }
  for (int i = 0; i >= 0; i = next[i]) out.push_back(id[i]);
}

// ------------------------------------------------------------ decode, chunks

std::string Gpt2Tokenizer::decode(int32_t id) const {
  BT_CHECK(id >= 0 && id < vocab_size(), "GPT-2 tokenizer: token id ", id, " is outside [0, ", vocab_size(),
           "); decode only ids that this tokenizer produced");
  return token_bytes_[id];
}

std::string Gpt2Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    BT_CHECK(id >= 0 && id < vocab_size(), "GPT-2 tokenizer: token id ", id, " is outside [0, ", vocab_size(),
             "); decode only ids that this tokenizer produced");
    out += token_bytes_[id];
  }
  return out;
}

std::vector<std::string_view> Gpt2Tokenizer::split_chunks(std::string_view text, size_t target_bytes) {
  auto printable = [](char c) { return c > ' ' && c < 0x7F; };
  std::vector<std::string_view> out;
  size_t start = 0;
  while (text.size() - start > std::max<size_t>(target_bytes, 1)) {
    size_t cut = std::string_view::npos;
    for (size_t nl = text.find('\n', start + std::max<size_t>(target_bytes, 1) - 1);
         nl != std::string_view::npos; nl = text.find('\n', nl + 1)) {
      if (nl > start && nl + 1 < text.size() && printable(text[nl - 1]) && printable(text[nl + 1])) {
        cut = nl + 1;
        break;
      }
    }
    if (cut == std::string_view::npos) break;
    out.push_back(text.substr(start, cut - start));
    start = cut;
  }
  out.push_back(text.substr(start));
  return out;
}

}  // namespace bt
