#include "text/byte_level.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace mneme::text {
namespace {

// GPT-2's bytes_to_unicode, written out the way the original defines it.
std::vector<char32_t> Gpt2BytesToUnicode() {
  std::vector<int> bs;
  for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
  std::vector<char32_t> cs(bs.begin(), bs.end());
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    bool present = false;
    for (int x : bs) present = present || x == b;
    if (!present) {
      bs.push_back(b);
      cs.push_back(256 + n++);
    }
  }
  std::vector<char32_t> table(256);
  for (size_t i = 0; i < bs.size(); ++i) table[bs[i]] = cs[i];
  return table;
}

TEST(ByteLevelTest, AlphabetMatchesGpt2) {
  const std::vector<char32_t> table = Gpt2BytesToUnicode();
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(ByteLevelCharOfByte(static_cast<uint8_t>(b)), table[b]) << b;
    EXPECT_EQ(ByteOfByteLevelChar(table[b]), std::optional<uint8_t>(b)) << b;
  }
  EXPECT_EQ(ByteLevelCharOfByte(' '), U'\u0120');   // Ġ
  EXPECT_EQ(ByteLevelCharOfByte('\n'), U'\u010A');  // Ċ
  EXPECT_EQ(ByteLevelCharOfByte('\t'), U'\u0109');  // ĉ
  EXPECT_EQ(ByteLevelCharOfByte(0xAD), U'\u0143');
  EXPECT_EQ(ByteOfByteLevelChar(U' '), std::nullopt);
  EXPECT_EQ(ByteOfByteLevelChar(U'\u0144'), std::nullopt);
  EXPECT_EQ(ByteOfByteLevelChar(U'\uFF5C'), std::nullopt);
}

TEST(ByteLevelTest, TokenBytes) {
  EXPECT_EQ(ByteLevelTokenBytes("\xC4\xA0hello"), " hello");  // "Ġhello"
  EXPECT_EQ(ByteLevelTokenBytes("caf\xC3\x83\xC2\xA9"), "caf\xC3\xA9");
  EXPECT_EQ(ByteLevelTokenBytes("\xC4\x8A\xC4\x8A"), "\n\n");  // "ĊĊ"
  EXPECT_EQ(ByteLevelTokenBytes("\xC3\x83"), "\xC3");  // "Ã": a lone byte
  EXPECT_EQ(ByteLevelTokenBytes(""), "");
}

TEST(ByteLevelTest, TokensOutsideTheAlphabetAreVerbatim) {
  // Added tokens: full-width bars and U+2581 are not byte-level characters.
  const std::string bos =
      "<\xEF\xBD\x9C"
      "begin\xE2\x96\x81of\xE2\x96\x81"
      "sentence\xEF\xBD\x9C>";
  EXPECT_EQ(ByteLevelTokenBytes(bos), bos);
  // One character outside the alphabet (a plain space) keeps all verbatim,
  // including the 'Ġ' that would otherwise become a space.
  EXPECT_EQ(ByteLevelTokenBytes("a \xC4\xA0"), "a \xC4\xA0");
}

TEST(ByteLevelTest, Utf8LossyReplacesMaximalSubparts) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(Utf8Lossy("plain"), "plain");
  EXPECT_EQ(Utf8Lossy("caf\xC3\xA9"), "caf\xC3\xA9");
  EXPECT_EQ(Utf8Lossy("\xC3"), r);
  EXPECT_EQ(Utf8Lossy("a\xC3"), "a" + r);
  EXPECT_EQ(Utf8Lossy("\xA4"), r);
  EXPECT_EQ(Utf8Lossy("\xE2\x80"), r);  // Truncated 3-byte: one.
  EXPECT_EQ(Utf8Lossy("\xE2\x80"
                      "A"),
            r + "A");
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x98"), r);  // Truncated 4-byte: one.
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), r + r + r);          // Surrogate.
  EXPECT_EQ(Utf8Lossy("\xC0\x80"), r + r);                  // Overlong.
  EXPECT_EQ(Utf8Lossy("\xE0\x80\x80"), r + r + r);          // Overlong.
  EXPECT_EQ(Utf8Lossy("\xF4\x90\x80\x80"), r + r + r + r);  // > U+10FFFF.
  EXPECT_EQ(Utf8Lossy("\xF5"), r);
  EXPECT_EQ(Utf8Lossy("\xFF\xFE"), r + r);
  EXPECT_EQ(Utf8Lossy("\xC3\xC3\xA9"), r + "\xC3\xA9");
}

TEST(ByteLevelTest, DecodeAndEncodeUtf8) {
  const std::optional<std::u32string> text =
      DecodeUtf8("a\xC3\xA9\xE2\x96\x81\xF0\x9F\x98\x80");
  ASSERT_TRUE(text.has_value());
  EXPECT_EQ(*text, (std::u32string{U'a', U'\u00E9', U'\u2581', U'\U0001F600'}));
  EXPECT_EQ(EncodeUtf8(*text), "a\xC3\xA9\xE2\x96\x81\xF0\x9F\x98\x80");
  EXPECT_FALSE(DecodeUtf8("\xC3").has_value());
  EXPECT_FALSE(DecodeUtf8("\xED\xA0\x80").has_value());
}

}  // namespace
}  // namespace mneme::text
