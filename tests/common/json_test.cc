#include "common/json.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mneme {
namespace {

TEST(JsonTest, ParsesWithoutThrowing) {
  EXPECT_TRUE(ParseJson(R"({"a": [1, 2]})").valid());
  for (const char* bad : {"", "{", "{\"a\":}", "[1,]", "{} {}", "nul",
                          "{\"a\": 1} // c", "\"\xff\""}) {
    EXPECT_FALSE(ParseJson(bad).valid()) << bad;
  }
  EXPECT_FALSE(ParseJson(std::string("{}\0{\"a\":1}", 10)).valid());
  EXPECT_FALSE(ParseJson(std::string("{}\0", 3)).valid());
}

TEST(JsonTest, ReportsDuplicateKeysAtAnyDepth) {
  EXPECT_FALSE(ParseJson(R"({"a": 1, "b": {"a": 2}})").duplicate_key);
  EXPECT_EQ(ParseJson(R"({"a": 1, "a": 2})").duplicate_key, "a");
  EXPECT_EQ(ParseJson(R"({"x": [{"k": 1, "k": 2}]})").duplicate_key, "k");
}

TEST(JsonTest, IntegerConversions) {
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

TEST(JsonTest, Utf8Validation) {
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

using ::testing::HasSubstr;

TEST(JsonTest, ParseJsonDocumentEnforcesLimitsAndKeys) {
  absl::StatusOr<nlohmann::json> ok = ParseJsonDocument(R"({"a": 1})", "f");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)["a"], 1);

  absl::StatusOr<nlohmann::json> bad = ParseJsonDocument("{", "f.json");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bad.status().message(), HasSubstr("f.json"));

  bad = ParseJsonDocument(R"({"a": 1, "a": 2})", "f.json");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bad.status().message(), HasSubstr("'a'"));
  JsonParseOptions lenient;
  lenient.reject_duplicate_keys = false;
  EXPECT_TRUE(ParseJsonDocument(R"({"a": 1, "a": 2})", "f", lenient).ok());

  JsonParseOptions small;
  small.max_bytes = 4;
  small.error_code = absl::StatusCode::kInvalidArgument;
  bad = ParseJsonDocument(R"({"a": 1})", "f", small);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ParseJsonDocument("{}", "f", small).ok());
}

TEST(JsonTest, RangedIntegersAndTokenIds) {
  using nlohmann::json;
  EXPECT_EQ(JsonToIntInRange(json::parse("5"), 0, 5), 5);
  EXPECT_FALSE(JsonToIntInRange(json::parse("6"), 0, 5));
  EXPECT_FALSE(JsonToIntInRange(json::parse("-1"), 0, 5));
  EXPECT_FALSE(JsonToIntInRange(json::parse("1.5"), 0, 5));
  EXPECT_EQ(JsonTokenId(json::parse("4294967295")), 4294967295);
  EXPECT_FALSE(JsonTokenId(json::parse("4294967296")));
  EXPECT_FALSE(JsonTokenId(json::parse("-1")));
  EXPECT_FALSE(JsonTokenId(json::parse("\"3\"")));
}

TEST(JsonTest, JsonFieldOrFallsBack) {
  const nlohmann::json obj = nlohmann::json::parse(
      R"({"i": 7, "big": 300, "neg": -1, "f": 2.5, "b": true, "s": "x",
          "n": null})");
  EXPECT_EQ(JsonFieldOr<int>(obj, "i", 0), 7);
  EXPECT_EQ(JsonFieldOr<uint8_t>(obj, "big", 9), 9);  // Does not fit.
  EXPECT_EQ(JsonFieldOr<uint32_t>(obj, "neg", 9u), 9u);
  EXPECT_EQ(JsonFieldOr<int>(obj, "f", 1), 1);  // Not an integer.
  EXPECT_EQ(JsonFieldOr<double>(obj, "i", 0.0), 7.0);
  EXPECT_EQ(JsonFieldOr<bool>(obj, "b", false), true);
  EXPECT_EQ(JsonFieldOr<std::string>(obj, "s", "d"), "x");
  EXPECT_EQ(JsonFieldOr<std::string>(obj, "n", "d"), "d");
  EXPECT_EQ(JsonFieldOr<std::string>(obj, "absent", "d"), "d");
  EXPECT_EQ(JsonFieldOr<int>(nlohmann::json::array(), "i", 3), 3);
}

TEST(JsonTest, JsonDumpNeverThrows) {
  nlohmann::json obj;
  obj["k"] = std::string("\xff");
  EXPECT_EQ(JsonDump(obj), "{\"k\":\"\xef\xbf\xbd\"}");
  EXPECT_EQ(JsonDump(nlohmann::json::parse("[1]"), 2), "[\n  1\n]");
}

TEST(JsonTest, FieldReaderNamesOriginAndPath) {
  const nlohmann::json doc = nlohmann::json::parse(
      R"({"model": {"vocab": {"a": 1}, "ids": [1, 70, "x"], "name": 3,
          "count": 12, "ok": true, "scale": 0.5, "none": null}})");
  const JsonFieldReader reader("tokenizer.json", absl::StatusCode::kDataLoss);
  ASSERT_TRUE(reader.Object(doc, "", "model").ok());
  const nlohmann::json& model = doc["model"];

  absl::StatusOr<int64_t> count = reader.Int(model, "model", "count", 0, 20);
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 12);
  count = reader.Int(model, "model", "count", 0, 10);
  EXPECT_EQ(count.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(count.status().message(),
            "tokenizer.json: model.count: 12 is outside [0, 10]");

  absl::StatusOr<std::string> name = reader.String(model, "model", "name");
  EXPECT_EQ(name.status().message(),
            "tokenizer.json: model.name: not a string");
  name = reader.String(model, "model", "none");
  EXPECT_EQ(name.status().message(), "tokenizer.json: model.none: missing");
  EXPECT_EQ(*reader.StringOr(model, "model", "absent", "d"), "d");
  EXPECT_FALSE(reader.StringOr(model, "model", "name", "d").ok());

  EXPECT_EQ(*reader.Bool(model, "model", "ok"), true);
  EXPECT_EQ(*reader.BoolOr(model, "model", "absent", false), false);
  EXPECT_FALSE(reader.BoolOr(model, "model", "count", false).ok());
  EXPECT_EQ(*reader.Number(model, "model", "scale"), 0.5);
  EXPECT_EQ(*reader.Uint(model, "model", "count"), 12u);
  EXPECT_FALSE(reader.Array(model, "model", "vocab").ok());
  EXPECT_TRUE(reader.Array(model, "model", "ids").ok());

  absl::StatusOr<std::vector<int64_t>> ids =
      reader.IntArray(model, "model", "ids", 0, 100);
  EXPECT_EQ(ids.status().message(),
            "tokenizer.json: model.ids[2]: not an integer");
  ids = reader.IntArray(model, "model", "ids", 0, 50);
  EXPECT_EQ(ids.status().message(),
            "tokenizer.json: model.ids[1]: 70 is outside [0, 50]");

  absl::StatusOr<const nlohmann::json*> field =
      reader.Find(model["count"], "model.count", "x");
  EXPECT_EQ(field.status().message(),
            "tokenizer.json: model.count: not a JSON object");
  EXPECT_EQ(JsonIndexPath("a.b", 3), "a.b[3]");
  EXPECT_EQ(JsonPath("", "a"), "a");
}

// A document of `depth` nested arrays: "[[[...]]]".
std::string NestedArrays(size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

TEST(JsonTest, NestingDepthCountsBracketsOutsideStrings) {
  EXPECT_EQ(JsonNestingDepth("1"), 0);
  EXPECT_EQ(JsonNestingDepth(R"({"a": [1, {"b": []}]})"), 4);
  EXPECT_EQ(JsonNestingDepth(R"(["[[[{{", "\"[["])"), 1);
  EXPECT_EQ(JsonNestingDepth(NestedArrays(1000)), 1000);
  EXPECT_EQ(JsonNestingDepth(std::string(1000, '[')), 1000);  // Unclosed.
}

TEST(JsonTest, ParseRefusesDeepNestingWithoutCrashing) {
  EXPECT_TRUE(ParseJson(NestedArrays(kMaxJsonDepth)).valid());
  const ParsedJson deep = ParseJson(NestedArrays(kMaxJsonDepth + 1));
  EXPECT_FALSE(deep.valid());
  EXPECT_TRUE(deep.too_deep);
  EXPECT_FALSE(ParseJson(NestedArrays(100000)).valid());
  EXPECT_TRUE(ParseJson(std::string(100000, '[')).too_deep);
  EXPECT_FALSE(ParseJson("[[1]]").too_deep);

  for (const std::string& text :
       {NestedArrays(100000), std::string(100000, '{'),
        absl::StrCat(R"({"a":)", std::string(100000, '['))}) {
    const absl::StatusOr<nlohmann::json> document =
        ParseJsonDocument(text, "config 'c.json'");
    EXPECT_EQ(document.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(document.status().message(),
              "config 'c.json' nests arrays / objects deeper than the limit "
              "of 128");
    const absl::StatusOr<nlohmann::ordered_json> ordered =
        ParseOrderedJsonDocument(text, "m.json");
    EXPECT_EQ(ordered.status().code(), absl::StatusCode::kInvalidArgument);
  }
  JsonParseOptions shallow;
  shallow.max_depth = 2;
  EXPECT_TRUE(ParseJsonDocument("[[]]", "f", shallow).ok());
  EXPECT_EQ(ParseJsonDocument("[[[]]]", "f", shallow).status().message(),
            "f nests arrays / objects deeper than the limit of 2");
}

TEST(JsonTest, OrderedDocumentKeepsKeyOrderAndChecksKeys) {
  absl::StatusOr<nlohmann::ordered_json> ok =
      ParseOrderedJsonDocument(R"({"b": 1, "a": 2})", "f");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->begin().key(), "b");
  EXPECT_EQ(
      ParseOrderedJsonDocument(R"({"a": 1, "a": 2})", "f").status().code(),
      absl::StatusCode::kDataLoss);
  EXPECT_FALSE(ParseOrderedJsonDocument("[", "f").ok());
}

TEST(JsonTest, DuplicateKeyMessageIsBounded) {
  const std::string key(100000, 'k');
  const absl::StatusOr<nlohmann::json> bad = ParseJsonDocument(
      absl::StrCat("{\"", key, "\": 1, \"", key, "\": 2}"), "f");
  ASSERT_FALSE(bad.ok());
  EXPECT_LT(bad.status().message().size(), 200u);
}

TEST(JsonTest, SnippetIsBounded) {
  EXPECT_EQ(JsonSnippet(nlohmann::json::parse(R"({"a": [1, "x"]})")),
            R"({"a":[1,"x"]})");
  EXPECT_EQ(JsonSnippet(nlohmann::json("abcdef"), 4), "\"abc...");
  EXPECT_EQ(JsonSnippet(nlohmann::json(std::string(1 << 20, 'x'))).size(), 83u);
  EXPECT_EQ(JsonSnippet(nlohmann::json::parse("[[[[[[1]]]]]]")),
            "[[[[[...]]]]]");
  nlohmann::json big = nlohmann::json::array();
  for (int i = 0; i < 100000; ++i) big.push_back(i);
  const std::string snippet = JsonSnippet(big, 20);
  EXPECT_EQ(snippet.size(), 23u);
  EXPECT_TRUE(absl::EndsWith(snippet, "...")) << snippet;
  // A value nested deeper than any parse allows (built in code) is quoted
  // without recursing through it.
  nlohmann::json deep = nlohmann::json::array();
  nlohmann::json* inner = &deep;
  for (int i = 0; i < 10000; ++i) {
    inner->push_back(nlohmann::json::array());
    inner = &(*inner)[0];
  }
  EXPECT_EQ(JsonSnippet(deep), "[[[[[...]]]]]");
  EXPECT_EQ(JsonSnippet(nlohmann::ordered_json::parse(R"({"b":1,"a":2})")),
            R"({"b":1,"a":2})");
  EXPECT_EQ(JsonSnippet(nlohmann::json(std::string("\xff"))),
            "\"\xef\xbf\xbd\"");
}

}  // namespace
}  // namespace mneme
