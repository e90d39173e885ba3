#include "text/python_json.h"

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace mneme::text {
namespace {

// Expected texts are Python 3's json.dumps(json.loads(input),
// ensure_ascii=False).
std::string Dumps(const std::string& json_text) {
  absl::StatusOr<std::string> text = PythonJsonDumpsOfText(json_text);
  EXPECT_TRUE(text.ok()) << json_text << ": " << text.status();
  return text.ok() ? *text : "<error>";
}

TEST(PythonJsonDumpsTest, SeparatorsAndKeyOrder) {
  EXPECT_EQ(Dumps(R"({"b":1,"a":[1,2,{}],"c":{"z":[],"y":null}})"),
            R"({"b": 1, "a": [1, 2, {}], "c": {"z": [], "y": null}})");
  EXPECT_EQ(Dumps("  [ ]  "), "[]");
  EXPECT_EQ(Dumps("{}"), "{}");
}

TEST(PythonJsonDumpsTest, NestedValues) {
  EXPECT_EQ(Dumps(R"({"a":{"b":{"c":[[1],[2,[3,{"d":"e"}]]]}}})"),
            R"({"a": {"b": {"c": [[1], [2, [3, {"d": "e"}]]]}}})");
}

TEST(PythonJsonDumpsTest, ScalarsIntsBoolsNull) {
  EXPECT_EQ(Dumps("true"), "true");
  EXPECT_EQ(Dumps("false"), "false");
  EXPECT_EQ(Dumps("null"), "null");
  EXPECT_EQ(Dumps("0"), "0");
  EXPECT_EQ(Dumps("-0"), "0");
  EXPECT_EQ(Dumps("-42"), "-42");
  EXPECT_EQ(Dumps("18446744073709551615"), "18446744073709551615");
  EXPECT_EQ(Dumps("-9223372036854775808"), "-9223372036854775808");
}

TEST(PythonJsonDumpsTest, FloatsAsPythonRepr) {
  EXPECT_EQ(Dumps("1.0"), "1.0");
  EXPECT_EQ(Dumps("2.50"), "2.5");
  EXPECT_EQ(Dumps("0.1"), "0.1");
  EXPECT_EQ(Dumps("-0.0"), "-0.0");
  EXPECT_EQ(Dumps("1E5"), "100000.0");
  EXPECT_EQ(Dumps("0.0001"), "0.0001");
  EXPECT_EQ(Dumps("0.00001234"), "1.234e-05");
  EXPECT_EQ(Dumps("1e15"), "1000000000000000.0");
  EXPECT_EQ(Dumps("9999999999999998.0"), "9999999999999998.0");
  EXPECT_EQ(Dumps("1e16"), "1e+16");
  EXPECT_EQ(Dumps("123456789012345678901"), "1.2345678901234568e+20");
  EXPECT_EQ(Dumps("1.7976931348623157e308"), "1.7976931348623157e+308");
  EXPECT_EQ(Dumps("5e-324"), "5e-324");
  EXPECT_EQ(Dumps("3.14159265358979"), "3.14159265358979");
}

TEST(PythonJsonDumpsTest, StringsKeepUnicodeAndEscapeLikePython) {
  EXPECT_EQ(Dumps(R"("中文 \ud83d\ude42 é")"), "\"中文 🙂 é\"");
  EXPECT_EQ(Dumps("\"中文\""), "\"中文\"");
  EXPECT_EQ(Dumps(R"("q\" b\\ s\/ n\n r\r t\t b\b f\f")"),
            R"("q\" b\\ s/ n\n r\r t\t b\b f\f")");
  EXPECT_EQ(Dumps(R"("\u0001\u001f\u007f\u2028")"),
            "\"\\u0001\\u001f\x7f\xE2\x80\xA8\"");
  EXPECT_EQ(Dumps(R"({"k\u00e9y": "v"})"), "{\"kéy\": \"v\"}");
}

TEST(PythonJsonDumpsTest, RepeatedKeyKeepsFirstPositionLastValue) {
  EXPECT_EQ(Dumps(R"({"a":1,"b":2,"a":3})"), R"({"a": 3, "b": 2})");
}

TEST(PythonJsonDumpsTest, RejectsWhatIsNotJson) {
  for (const std::string& bad : std::vector<std::string>{
           "", "[1,]", "{\"x\": NaN}", "1E400", "\"\\ud800\"", "{} x", "'a'",
           std::string("{}\0{}", 5), "\"\xff\""}) {
    EXPECT_EQ(PythonJsonDumpsOfText(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(PythonJsonDumpsTest, BoundsNesting) {
  const std::string ok = std::string(kMaxPythonJsonDepth, '[') +
                         std::string(kMaxPythonJsonDepth, ']');
  EXPECT_TRUE(PythonJsonDumpsOfText(ok).ok());
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_EQ(PythonJsonDumpsOfText(deep).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Brackets inside strings do not count.
  EXPECT_EQ(Dumps(R"(["[[[[{{{{", "\"[["])"), R"(["[[[[{{{{", "\"[["])");
  // Values built in code are bounded too.
  nlohmann::ordered_json value = nlohmann::ordered_json::array();
  for (int i = 0; i < kMaxPythonJsonDepth + 1; ++i) {
    value = nlohmann::ordered_json::array({std::move(value)});
  }
  EXPECT_EQ(PythonJsonDumps(value).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PythonJsonDumpsTest, RejectsInvalidUtf8InBuiltValues) {
  EXPECT_EQ(PythonJsonDumps(nlohmann::ordered_json("\xc3")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PythonJsonDumps(
                nlohmann::ordered_json(std::numeric_limits<double>::infinity()))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mneme::text
