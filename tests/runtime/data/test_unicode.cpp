// UTF-8 decoding and replacement, and the JavaScript regex character classes.

#include <string>

#include <gtest/gtest.h>

#include "runtime/data/unicode.h"

namespace bt::unicode {
namespace {

Utf8Char dec(const std::string& s) { return decode_utf8(s.data(), s.data() + s.size()); }
// gtest cannot print char32_t.
uint32_t u(char32_t c) { return static_cast<uint32_t>(c); }

TEST(Unicode, DecodesOneToFourBytes) {
  EXPECT_EQ(u(dec("a").cp), 0x61u);
  EXPECT_EQ(dec("a").len, 1);
  EXPECT_EQ(u(dec("\xC3\xA9").cp), 0xE9u);  // é
  EXPECT_EQ(dec("\xC3\xA9").len, 2);
  EXPECT_EQ(u(dec("\xE2\x82\xAC").cp), 0x20ACu);  // €
  EXPECT_EQ(dec("\xE2\x82\xAC").len, 3);
  EXPECT_EQ(u(dec("\xF0\x9F\x98\x80").cp), 0x1F600u);  // 😀
  EXPECT_EQ(dec("\xF0\x9F\x98\x80").len, 4);
  EXPECT_TRUE(dec("\xF0\x9F\x98\x80").valid);
}

TEST(Unicode, EncodeDecodeRoundTripsEveryScalarValue) {
  for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string s;
    append_utf8(s, cp);
    const Utf8Char c = dec(s);
    ASSERT_TRUE(c.valid) << std::hex << u(cp);
    ASSERT_EQ(u(c.cp), u(cp));
    ASSERT_EQ(c.len, static_cast<int>(s.size()));
  }
}

// The WHATWG Encoding Standard's replacement (one U+FFFD per maximal subpart),
// which node applies when it reads a file as 'utf8'.
TEST(Unicode, ReplacesMaximalSubparts) {
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(sanitize_utf8("a\xED\xA0\x80z"), "a" + R + R + R + "z");  // encoded surrogate
  EXPECT_EQ(sanitize_utf8("b\xE2\x82z"), "b" + R + "z");              // truncated 3-byte
  EXPECT_EQ(sanitize_utf8("c\xF0\x9F\x98"), "c" + R);                 // truncated at the end
  EXPECT_EQ(sanitize_utf8("\xC0\xAF"), R + R);                        // overlong
  EXPECT_EQ(sanitize_utf8("\xE0\x80\xAF"), R + R + R);                // overlong
  EXPECT_EQ(sanitize_utf8("\xF4\x90\x80\x80"), R + R + R + R);        // above U+10FFFF
  EXPECT_EQ(sanitize_utf8("\xFF\xFE"), R + R);                        // never valid
  EXPECT_EQ(sanitize_utf8("\x80x\xBF"), R + "x" + R);                 // stray continuations
  EXPECT_EQ(sanitize_utf8("ok \xC3\xA9 \xF0\x9F\x98\x80"),
            "ok \xC3\xA9 \xF0\x9F\x98\x80");  // valid: unchanged
  EXPECT_TRUE(is_valid_utf8("ok \xC3\xA9 \xF0\x9F\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));
  EXPECT_FALSE(is_valid_utf8("\xC3"));
  EXPECT_TRUE(is_valid_utf8(""));
}

TEST(Unicode, LettersAreUnicodeL) {
  for (char32_t c : {U'A', U'z', U'é', U'ß', U'Ω', U'ж', U'中', U'テ', U'ー', U'ا', U'א', U'\U00020000'})
    EXPECT_TRUE(is_letter(c)) << std::hex << static_cast<uint32_t>(c);
  for (char32_t c : {U'_', U'\'', U'5', U'\u0301', U'\U0001F600', U' '})  // U+0301 combining acute is Mn
    EXPECT_FALSE(is_letter(c)) << std::hex << static_cast<uint32_t>(c);
}

TEST(Unicode, NumbersAreUnicodeN) {
  for (char32_t c : {U'0', U'9', U'٣', U'½', U'²', U'Ⅻ', U'\U0001D7CE'})
    EXPECT_TRUE(is_number(c)) << std::hex << static_cast<uint32_t>(c);
  for (char32_t c : {U'a', U'.', U','}) EXPECT_FALSE(is_number(c)) << std::hex << static_cast<uint32_t>(c);
}

TEST(Unicode, SpacesAreJavaScriptBackslashS) {
  for (char32_t c : {U'\t', U'\n', U'\v', U'\f', U'\r', U' ', U'\u00A0', U'\u1680', U'\u2000', U'\u200A',
                     U'\u2028', U'\u2029', U'\u202F', U'\u205F', U'\u3000', U'\uFEFF'})
    EXPECT_TRUE(is_space(c)) << std::hex << static_cast<uint32_t>(c);
  // NEL, Mongolian vowel separator and zero-width space are not in JS's \s.
  for (char32_t c : {U'\u0085', U'\u180E', U'\u200B', U'a', U'\0'})
    EXPECT_FALSE(is_space(c)) << std::hex << static_cast<uint32_t>(c);
}

TEST(Unicode, ClassesDoNotOverlapAndReplacementIsOther) {
  EXPECT_EQ(char_class(kReplacement), CharClass::Other);
  EXPECT_EQ(char_class(0xD800), CharClass::Other);  // a lone surrogate
  EXPECT_EQ(char_class(0x10FFFF), CharClass::Other);
}

}  // namespace
}  // namespace bt::unicode
