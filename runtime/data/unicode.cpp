#include "runtime/data/unicode.h"

#include <algorithm>
#include <array>
#include <iterator>

namespace bt::unicode {
namespace {

struct CodeRange {
  char32_t first, last;
};

#include "runtime/data/unicode_tables.inc"

template <size_t N>
bool in_ranges(const CodeRange (&r)[N], char32_t cp) {
  const CodeRange* it = std::upper_bound(std::begin(r), std::end(r), cp,
                                         [](char32_t c, const CodeRange& x) { return c < x.first; });
  return it != std::begin(r) && cp <= (it - 1)->last;
}

CharClass classify_slow(char32_t cp) {
  if (in_ranges(kLetterRanges, cp)) return CharClass::Letter;
  if (in_ranges(kNumberRanges, cp)) return CharClass::Number;
  if (in_ranges(kSpaceRanges, cp)) return CharClass::Space;
  return CharClass::Other;
}

// The Basic Multilingual Plane, looked up directly (64 KiB, built on first use).
const std::array<CharClass, 0x10000>& bmp_table() {
  static const auto table = [] {
    std::array<CharClass, 0x10000> t{};
    for (char32_t c = 0; c < 0x10000; ++c) t[c] = classify_slow(c);
    return t;
  }();
  return table;
}

bool cont(unsigned char b) { return (b & 0xC0) == 0x80; }

}  // namespace

Utf8Char decode_utf8(const char* p, const char* end) {
  const auto* s = reinterpret_cast<const unsigned char*>(p);
  const ptrdiff_t avail = end - p;
  const unsigned char b0 = s[0];
  if (b0 < 0x80) return {b0, 1, true};
  int need;
  char32_t cp;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return {kReplacement, 1, false};
  }
  // Maximal subpart: the replacement covers the valid prefix read so far.
  for (int i = 1; i <= need; ++i) {
    if (i >= avail) return {kReplacement, i, false};
    const unsigned char b = s[i];
    if (i == 1 ? (b < lo || b > hi) : !cont(b)) return {kReplacement, i, false};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, need + 1, true};
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_valid_utf8(std::string_view s) {
  const char* p = s.data();
  const char* end = p + s.size();
  while (p < end) {
    if (static_cast<unsigned char>(*p) < 0x80) {
      ++p;
      continue;
    }
    const Utf8Char c = decode_utf8(p, end);
    if (!c.valid) return false;
    p += c.len;
  }
  return true;
}

std::string sanitize_utf8(std::string_view s) {
  if (is_valid_utf8(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  const char* p = s.data();
  const char* end = p + s.size();
  while (p < end) {
    const Utf8Char c = decode_utf8(p, end);
    if (c.valid)
      out.append(p, c.len);
    else
      append_utf8(out, kReplacement);
    p += c.len;
  }
  return out;
}

CharClass char_class(char32_t cp) { return cp < 0x10000 ? bmp_table()[cp] : classify_slow(cp); }

}  // namespace bt::unicode
