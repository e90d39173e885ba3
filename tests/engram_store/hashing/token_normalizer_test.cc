#include "engram_store/hashing/token_normalizer.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engram_store/hashing/python_runner.h"
#include "text/byte_level.h"

namespace mneme::engram {
namespace {

using ::mneme::engram::testing::ReadFile;
using ::mneme::engram::testing::RunfilePath;
using ::mneme::engram::testing::RunPython;
using ::mneme::engram::testing::TempPath;
using ::mneme::engram::testing::WriteFile;

std::string Normalize(const std::string& text) {
  absl::StatusOr<std::string> out = NormalizeTokenText(text);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : "<error>";
}

TEST(TokenNormalizerTest, Case) {
  EXPECT_EQ(Normalize("Hello"), "hello");
  EXPECT_EQ(Normalize("HELLO"), "hello");
  EXPECT_EQ(Normalize("\xC3\x9F"), "\xC3\x9F");      // ß stays ß
  EXPECT_EQ(Normalize("\xE1\xBA\x9E"), "\xC3\x9F");  // ẞ -> ß
  EXPECT_EQ(Normalize("\xD0\x9C\xD0\x98\xD0\xA0"),   // МИР
            "\xD0\xBC\xD0\xB8\xD1\x80");             // мир
}

TEST(TokenNormalizerTest, LowercaseIsPerCharacterWithoutContext) {
  // ΟΔΟΣ: Rust's char::to_lowercase gives σ, not the final ς.
  EXPECT_EQ(Normalize("\xCE\x9F\xCE\x94\xCE\x9F\xCE\xA3"),
            "\xCE\xBF\xCE\xB4\xCE\xBF\xCF\x83");
  // İ: NFD splits off the dot (a mark, dropped) before lowercasing.
  EXPECT_EQ(Normalize("\xC4\xB0"), "i");
}

TEST(TokenNormalizerTest, Accents) {
  EXPECT_EQ(Normalize("caf\xC3\xA9"), "cafe");    // precomposed é
  EXPECT_EQ(Normalize("CAF\xC3\x89"), "cafe");    // É
  EXPECT_EQ(Normalize("cafe\xCC\x81"), "cafe");   // e + U+0301
  EXPECT_EQ(Normalize("na\xC3\xAFve"), "naive");  // ï
  EXPECT_EQ(Normalize("\xC5\x84"), "n");          // ń
  EXPECT_EQ(Normalize("\xC7\x84"), "dz");         // Ǆ -> DŽ -> dz
}

TEST(TokenNormalizerTest, AllMarkCategoriesAreStripped) {
  // Hugging Face's StripAccents drops General_Category M: Mn, Mc and Me.
  EXPECT_EQ(Normalize("\xE0\xA4\x95\xE0\xA4\xBE"), "\xE0\xA4\x95");  // का
  EXPECT_EQ(Normalize("a\xE2\x83\x9D"), "a");  // U+20DD enclosing circle
  // Thai SARA AM: NFKC splits off NIKHAHIT (Mn), SARA AA stays.
  EXPECT_EQ(Normalize("\xE0\xB8\xB3"), "\xE0\xB8\xB2");
}

TEST(TokenNormalizerTest, CompatibilityForms) {
  EXPECT_EQ(Normalize("\xEF\xBC\xA8\xEF\xBD\x85\xEF\xBD\x8C\xEF\xBD\x8C"
                      "\xEF\xBD\x8F"),
            "hello");                                      // Ｈｅｌｌｏ
  EXPECT_EQ(Normalize("\xEF\xBC\x91\xEF\xBC\x92"), "12");  // １２
  EXPECT_EQ(Normalize("\xEF\xAC\x81"), "fi");              // ﬁ ligature
  EXPECT_EQ(Normalize("\xE2\x85\xAB"), "xii");             // Ⅻ
  EXPECT_EQ(Normalize("\xEF\xBD\x9C"), "|");               // full-width bar
  // Hangul syllables stay decomposed into jamo after NFD.
  EXPECT_EQ(Normalize("\xED\x95\x9C"), "\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB");
  EXPECT_EQ(Normalize("\xE4\xB8\xAD\xE6\x96\x87"), "\xE4\xB8\xAD\xE6\x96\x87");
}

TEST(TokenNormalizerTest, Whitespace) {
  EXPECT_EQ(Normalize(" "), " ");
  EXPECT_EQ(Normalize("   "), " ");
  EXPECT_EQ(Normalize("\n"), " ");
  EXPECT_EQ(Normalize("\t\t"), " ");
  EXPECT_EQ(Normalize("\r\n"), " ");
  EXPECT_EQ(Normalize(" \n\t "), " ");
  EXPECT_EQ(Normalize("\xC2\xA0"), " ");      // NBSP: NFKC makes it a space
  EXPECT_EQ(Normalize("\xE3\x80\x80"), " ");  // ideographic space
  EXPECT_EQ(Normalize(" Hello"), "hello");
  EXPECT_EQ(Normalize("  a \t b  "), "a b");
  EXPECT_EQ(Normalize("a\n"), "a");
  // White_Space outside [ \t\r\n] is not collapsed, only stripped.
  EXPECT_EQ(Normalize("\xE2\x80\xA8"), "");  // U+2028
  EXPECT_EQ(Normalize("\x0B"), "");          // vertical tab
  EXPECT_EQ(Normalize("a\x0B"
                      "b"),
            "a\x0B"
            "b");
  EXPECT_EQ(Normalize(" \xE2\x80\xA8"), "");
}

TEST(TokenNormalizerTest, EmptyResults) {
  EXPECT_EQ(Normalize(""), "");
  EXPECT_EQ(Normalize("\xCC\x81"), "");  // a lone combining acute
}

TEST(TokenNormalizerTest, SentinelCharacterBecomesASpace) {
  // The reference protects a lone space with U+E000 and then turns every
  // U+E000 into a space, including one that was in the text.
  EXPECT_EQ(Normalize("\xEE\x80\x80"), " ");
  EXPECT_EQ(Normalize(" \xEE\x80\x80 "), " ");
  EXPECT_EQ(Normalize("a\xEE\x80\x80"
                      "b"),
            "a b");
}

TEST(TokenNormalizerTest, InvalidUtf8IsInvalidArgument) {
  EXPECT_EQ(NormalizeTokenText("\xC3").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Random strings from interesting parts of Unicode against an independent
// Python implementation (unicodedata instead of ICU).
TEST(TokenNormalizerTest, MatchesPythonReferenceOnRandomText) {
  const std::vector<std::pair<char32_t, char32_t>> pools = {
      {0x20, 0x7E},     {0x09, 0x0D},       {0x80, 0x24F},
      {0x300, 0x36F},   {0x370, 0x3FF},     {0x400, 0x4FF},
      {0x900, 0x97F},   {0xE00, 0xE5B},     {0x1E00, 0x1EFF},
      {0x2000, 0x206F}, {0x2150, 0x218B},   {0x2460, 0x24FF},
      {0x3000, 0x303F}, {0x3131, 0x318E},   {0xAC00, 0xAC40},
      {0xE000, 0xE002}, {0xF900, 0xF9FF},   {0xFB00, 0xFB4F},
      {0xFF01, 0xFFEE}, {0x1D400, 0x1D4FF}, {0x1F600, 0x1F64F},
  };
  std::mt19937 rng(1234);
  std::vector<std::string> texts;
  for (int i = 0; i < 20000; ++i) {
    std::u32string text;
    const int length = static_cast<int>(rng() % 6);
    for (int k = 0; k < length; ++k) {
      const auto& [lo, hi] = pools[rng() % pools.size()];
      text.push_back(lo + rng() % (hi - lo + 1));
    }
    texts.push_back(text::EncodeUtf8(text));
  }
  const std::string in = TempPath("normalizer_in.json");
  const std::string out = TempPath("normalizer_out.json");
  ASSERT_TRUE(WriteFile(in, nlohmann::json(texts).dump()).ok());
  const absl::Status run = RunPython(
      RunfilePath("tests/engram_store/hashing/normalizer_reference.py"),
      {in, out});
  ASSERT_TRUE(run.ok()) << run;
  absl::StatusOr<std::string> result_text = ReadFile(out);
  ASSERT_TRUE(result_text.ok());
  const nlohmann::json expected = nlohmann::json::parse(
      *result_text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(expected.is_array());
  ASSERT_EQ(expected.size(), texts.size());
  int compared = 0;
  int mismatches = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (expected[i].is_null()) continue;
    ++compared;
    const std::string got = Normalize(texts[i]);
    if (got != expected[i].get<std::string>() && ++mismatches <= 10) {
      ADD_FAILURE() << "input " << nlohmann::json(texts[i]).dump() << " got "
                    << nlohmann::json(got).dump() << " expected "
                    << expected[i].dump();
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(compared, 15000);
}

}  // namespace
}  // namespace mneme::engram
