#include "common/json_util.h"

#include <string>

#include "gtest/gtest.h"

namespace mneme {
namespace {

TEST(JsonUtilTest, ParsesWithoutThrowing) {
  EXPECT_TRUE(ParseJson(R"({"a": [1, 2]})").valid());
  for (const char* bad : {"", "{", "{\"a\":}", "[1,]", "{} {}", "nul",
                          "{\"a\": 1} // c", "\"\xff\""}) {
    EXPECT_FALSE(ParseJson(bad).valid()) << bad;
  }
  EXPECT_FALSE(ParseJson(std::string("{}\0{\"a\":1}", 10)).valid());
  EXPECT_FALSE(ParseJson(std::string("{}\0", 3)).valid());
}

TEST(JsonUtilTest, ReportsDuplicateKeysAtAnyDepth) {
  EXPECT_FALSE(ParseJson(R"({"a": 1, "b": {"a": 2}})").duplicate_key);
  EXPECT_EQ(ParseJson(R"({"a": 1, "a": 2})").duplicate_key, "a");
  EXPECT_EQ(ParseJson(R"({"x": [{"k": 1, "k": 2}]})").duplicate_key, "k");
}

TEST(JsonUtilTest, IntegerConversions) {
  using nlohmann::json;
  EXPECT_EQ(JsonToUint64(json::parse("18446744073709551615")),
            18446744073709551615ull);
  EXPECT_FALSE(JsonToUint64(json::parse("18446744073709551616")));
  EXPECT_FALSE(JsonToUint64(json::parse("-1")));
  EXPECT_FALSE(JsonToUint64(json::parse("1.0")));
  EXPECT_FALSE(JsonToUint64(json::parse("\"1\"")));
  EXPECT_EQ(JsonToInt64(json::parse("-9223372036854775808")),
            std::numeric_limits<int64_t>::min());
  EXPECT_EQ(JsonToInt64(json::parse("9223372036854775807")),
            std::numeric_limits<int64_t>::max());
  EXPECT_FALSE(JsonToInt64(json::parse("9223372036854775808")));
  EXPECT_FALSE(JsonToInt64(json::parse("true")));
}

TEST(JsonUtilTest, Utf8Validation) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("layers.1.engram"));
  EXPECT_TRUE(IsValidUtf8("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xff"));
  EXPECT_FALSE(IsValidUtf8("\xc3"));              // Truncated.
  EXPECT_FALSE(IsValidUtf8("\xc0\x80"));          // Overlong.
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // Surrogate.
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // Above U+10FFFF.
  EXPECT_FALSE(IsValidUtf8("\xe2\x28\xa1"));      // Bad continuation.
}

}  // namespace
}  // namespace mneme
