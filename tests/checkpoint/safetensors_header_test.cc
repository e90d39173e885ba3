#include "checkpoint/safetensors_header.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/checkpoint_test_util.h"

namespace mneme::checkpoint {
namespace {

using ::mneme::checkpoint::testing::SafetensorsBytes;
using ::testing::HasSubstr;

constexpr char kFile[] = "dir/bad.safetensors";

absl::StatusOr<SafetensorsHeader> ParseHeader(const std::string& header_json,
                                              size_t data_bytes) {
  return ParseSafetensorsBuffer(
      SafetensorsBytes(header_json, std::string(data_bytes, '\0')), kFile);
}

TEST(SafetensorsHeaderTest, ParsesValidHeader) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("b":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]},)"
      R"("a":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]},)"
      R"("s":{"dtype":"I64","shape":[],"data_offsets":[32,40]},)"
      R"("z":{"dtype":"U8","shape":[0,7],"data_offsets":[40,40]}})"
      "    ";
  absl::StatusOr<SafetensorsHeader> parsed = ParseHeader(header, 40);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->header_length, header.size());
  EXPECT_EQ(parsed->data_offset, 8 + header.size());
  EXPECT_EQ(parsed->file_size, 8 + header.size() + 40);
  EXPECT_EQ(parsed->metadata.at("format"), "pt");
  ASSERT_EQ(parsed->tensors.size(), 4u);
  EXPECT_EQ(parsed->tensors[0].name, "a");  // Sorted by name.
  EXPECT_EQ(parsed->tensors[1].name, "b");
  const TensorInfo* b = parsed->Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::kF32);
  EXPECT_EQ(b->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(b->offset, parsed->data_offset + 8);
  EXPECT_EQ(b->byte_length, 24u);
  EXPECT_EQ(b->NumElements(), 6);
  const TensorInfo* s = parsed->Find("s");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->NumElements(), 1);
  EXPECT_EQ(s->byte_length, 8u);
  EXPECT_EQ(parsed->Find("z")->byte_length, 0u);
  EXPECT_EQ(parsed->Find("missing"), nullptr);
}

TEST(SafetensorsHeaderTest, AllowsGapsAndTrailingBytes) {
  absl::StatusOr<SafetensorsHeader> parsed =
      ParseHeader(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},)"
                  R"("b":{"dtype":"U8","shape":[2],"data_offsets":[16,18]}})",
                  64);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->tensors.size(), 2u);
}

TEST(SafetensorsHeaderTest, EmptyTensorInsideAnotherIsNotAnOverlap) {
  absl::StatusOr<SafetensorsHeader> parsed =
      ParseHeader(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                  R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                  8);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
}

TEST(SafetensorsHeaderTest, TensorsInFileOrderSortsByOffsetThenName) {
  // Names sort a, b, c, d; bytes lie c [0,4), then a and d (empty) at 4,
  // then b [8,10).
  absl::StatusOr<SafetensorsHeader> parsed =
      ParseHeader(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},)"
                  R"("b":{"dtype":"U8","shape":[2],"data_offsets":[8,10]},)"
                  R"("c":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                  R"("d":{"dtype":"U8","shape":[0],"data_offsets":[4,4]}})",
                  10);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  std::vector<std::string> order;
  for (const TensorInfo* t : parsed->TensorsInFileOrder()) {
    order.push_back(t->name);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"c", "a", "d", "b"}));
}

TEST(SafetensorsHeaderTest, IgnoresUnknownTensorFields) {
  absl::StatusOr<SafetensorsHeader> parsed = ParseHeader(
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":[1]}})", 1);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
}

TEST(SafetensorsHeaderTest, EmptyHeaderObjectIsValid) {
  absl::StatusOr<SafetensorsHeader> parsed = ParseHeader("{}", 0);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->tensors.empty());
}

TEST(SafetensorsHeaderTest, FileShorterThanLengthIsDataLoss) {
  for (size_t size : {0, 1, 7}) {
    absl::StatusOr<SafetensorsHeader> parsed =
        ParseSafetensorsBuffer(std::string(size, '\0'), kFile);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss) << size;
    EXPECT_THAT(parsed.status().message(), HasSubstr(kFile));
    EXPECT_THAT(parsed.status().message(), HasSubstr("too short"));
  }
}

TEST(SafetensorsHeaderTest, HeaderLengthPastEndOfFileIsDataLoss) {
  std::string bytes = SafetensorsBytes("{}", "");
  bytes[0] = 3;  // Claims 3 header bytes, only 2 follow.
  absl::StatusOr<SafetensorsHeader> parsed =
      ParseSafetensorsBuffer(bytes, kFile);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(parsed.status().message(), HasSubstr(kFile));
  EXPECT_THAT(parsed.status().message(), HasSubstr("past the end"));
}

TEST(SafetensorsHeaderTest, AbsurdHeaderLengthIsDataLoss) {
  std::string bytes = SafetensorsBytes("{}", "");
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(0xFF);
  absl::StatusOr<SafetensorsHeader> parsed =
      ParseSafetensorsBuffer(bytes, kFile);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(parsed.status().message(), HasSubstr("exceeds the limit"));
  EXPECT_THAT(parsed.status().message(), HasSubstr(kFile));
}

TEST(SafetensorsHeaderTest, HeaderLengthAboveConfiguredCapIsDataLoss) {
  SafetensorsParseOptions options;
  options.max_header_bytes = 16;
  const std::string header =
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  absl::StatusOr<SafetensorsHeader> parsed =
      ParseSafetensorsBuffer(SafetensorsBytes(header, "x"), kFile, options);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(parsed.status().message(), HasSubstr("exceeds the limit of 16"));
}

// A header that must be rejected, and the text its message must contain
// (besides the file name).
struct BadHeader {
  const char* label;
  std::string header_json;
  size_t data_bytes;
  std::string want_in_message;
};

void PrintTo(const BadHeader& bad, std::ostream* os) { *os << bad.label; }

class BadHeaderTest : public ::testing::TestWithParam<BadHeader> {};

TEST_P(BadHeaderTest, IsDataLossNamingFileAndTensor) {
  const BadHeader& bad = GetParam();
  absl::StatusOr<SafetensorsHeader> parsed =
      ParseHeader(bad.header_json, bad.data_bytes);
  ASSERT_FALSE(parsed.ok()) << bad.label;
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss)
      << parsed.status();
  EXPECT_THAT(parsed.status().message(), HasSubstr(kFile));
  EXPECT_THAT(parsed.status().message(), HasSubstr(bad.want_in_message));
}

// A well-formed entry for tensor `name` with the given fields.
std::string Entry(const std::string& name, const std::string& dtype,
                  const std::string& shape, const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":" + dtype + ",\"shape\":" + shape +
         ",\"data_offsets\":" + offsets + "}";
}

std::string Header(const std::string& entries) { return "{" + entries + "}"; }

INSTANTIATE_TEST_SUITE_P(
    AllCases, BadHeaderTest,
    ::testing::Values(
        BadHeader{"malformed", "{\"w\": {", 0, "not valid JSON"},
        BadHeader{"trailing garbage", "{} x", 0, "not valid JSON"},
        BadHeader{"empty header", "", 0, "not valid JSON"},
        BadHeader{"nul padding", std::string("{}\0\0", 4), 0, "not valid JSON"},
        BadHeader{"invalid utf8", "{\"w\xff\":{}}", 0, "not valid JSON"},
        BadHeader{"not an object", "[1, 2]", 0, "not a JSON object"},
        BadHeader{"duplicate tensor",
                  Header(Entry("dup.w", "\"U8\"", "[1]", "[0,1]") + "," +
                         Entry("dup.w", "\"U8\"", "[1]", "[1,2]")),
                  2, "dup.w"},
        BadHeader{"duplicate field",
                  R"({"w":{"dtype":"U8","dtype":"I8","shape":[1],)"
                  R"("data_offsets":[0,1]}})",
                  1, "dtype"},
        BadHeader{"entry not object", R"({"layers.1.w": 5})", 0, "layers.1.w"},
        BadHeader{"missing dtype",
                  R"({"t.missing_dtype":{"shape":[1],"data_offsets":[0,1]}})",
                  1, "t.missing_dtype"},
        BadHeader{"missing shape",
                  R"({"t.missing_shape":{"dtype":"U8","data_offsets":[0,1]}})",
                  1, "t.missing_shape"},
        BadHeader{"missing offsets",
                  R"({"t.missing_off":{"dtype":"U8","shape":[1]}})", 1,
                  "t.missing_off"},
        BadHeader{"dtype not string",
                  Header(Entry("t.dtype_num", "7", "[1]", "[0,1]")), 1,
                  "t.dtype_num"},
        BadHeader{"unknown dtype",
                  Header(Entry("t.f64", "\"F64\"", "[1]", "[0,8]")), 8,
                  "unsupported dtype \"F64\""},
        BadHeader{"unknown dtype names tensor",
                  Header(Entry("t.f64", "\"F64\"", "[1]", "[0,8]")), 8,
                  "t.f64"},
        BadHeader{"shape not array",
                  Header(Entry("t.shape_obj", "\"U8\"", "{}", "[0,1]")), 1,
                  "t.shape_obj"},
        BadHeader{"negative dimension",
                  Header(Entry("t.neg", "\"U8\"", "[2,-1]", "[0,0]")), 0,
                  "t.neg"},
        BadHeader{"fractional dimension",
                  Header(Entry("t.frac", "\"U8\"", "[2.5]", "[0,2]")), 2,
                  "t.frac"},
        BadHeader{"string dimension",
                  Header(Entry("t.str", "\"U8\"", "[\"2\"]", "[0,2]")), 2,
                  "t.str"},
        BadHeader{"dimension beyond 64 bits",
                  Header(Entry("t.huge", "\"U8\"", "[18446744073709551616]",
                               "[0,1]")),
                  1, "t.huge"},
        BadHeader{
            "dimension beyond int64",
            Header(Entry("t.big", "\"U8\"", "[9223372036854775808]", "[0,1]")),
            1, "t.big"},
        BadHeader{"element count overflows",
                  Header(Entry("t.overflow", "\"U8\"",
                               "[4294967296,4294967296]", "[0,1]")),
                  1, "overflows 64 bits"},
        BadHeader{"byte count overflows",
                  Header(Entry("t.bytes_overflow", "\"I64\"",
                               "[4611686018427387904]", "[0,1]")),
                  1, "t.bytes_overflow"},
        BadHeader{"offsets not array",
                  Header(Entry("t.off_obj", "\"U8\"", "[1]", "{}")), 1,
                  "t.off_obj"},
        BadHeader{"one offset", Header(Entry("t.off1", "\"U8\"", "[1]", "[0]")),
                  1, "t.off1"},
        BadHeader{"three offsets",
                  Header(Entry("t.off3", "\"U8\"", "[1]", "[0,1,2]")), 2,
                  "t.off3"},
        BadHeader{"negative offset",
                  Header(Entry("t.offneg", "\"U8\"", "[1]", "[-1,0]")), 1,
                  "t.offneg"},
        BadHeader{"begin after end",
                  Header(Entry("t.backwards", "\"U8\"", "[1]", "[5,4]")), 8,
                  "t.backwards"},
        BadHeader{"end past data region",
                  Header(Entry("t.past_end", "\"U8\"", "[4]", "[4,8]")), 7,
                  "t.past_end"},
        BadHeader{"offsets beyond 64 bits",
                  Header(Entry("t.off_huge", "\"U8\"", "[0]",
                               "[18446744073709551616,18446744073709551616]")),
                  0, "t.off_huge"},
        BadHeader{"length does not match shape",
                  Header(Entry("t.mismatch", "\"F32\"", "[2]", "[0,4]")), 8,
                  "t.mismatch"},
        BadHeader{"length does not match dtype",
                  Header(Entry("t.bf16", "\"BF16\"", "[4]", "[0,4]")), 8,
                  "needs 8"},
        BadHeader{"overlap names first tensor",
                  Header(Entry("t.first", "\"U8\"", "[8]", "[0,8]") + "," +
                         Entry("t.second", "\"U8\"", "[8]", "[4,12]")),
                  12, "t.first"},
        BadHeader{"overlap names second tensor",
                  Header(Entry("t.first", "\"U8\"", "[8]", "[0,8]") + "," +
                         Entry("t.second", "\"U8\"", "[8]", "[4,12]")),
                  12, "t.second"},
        BadHeader{"identical ranges overlap",
                  Header(Entry("t.x", "\"U8\"", "[4]", "[0,4]") + "," +
                         Entry("t.y", "\"U8\"", "[4]", "[0,4]")),
                  4, "overlap"},
        BadHeader{"contained range overlaps",
                  Header(Entry("t.outer", "\"U8\"", "[16]", "[0,16]") + "," +
                         Entry("t.mid", "\"U8\"", "[2]", "[4,6]") + "," +
                         Entry("t.late", "\"U8\"", "[2]", "[8,10]")),
                  16, "overlap"},
        BadHeader{"metadata not object", R"({"__metadata__":[1]})", 0,
                  "__metadata__"},
        BadHeader{"metadata value not string",
                  R"({"__metadata__":{"format":1}})", 0, "format"}),
    [](const ::testing::TestParamInfo<BadHeader>& info) {
      std::string name = info.param.label;
      for (char& c : name) {
        if (!isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

TEST(SafetensorsHeaderTest, LengthParserReportsExactLength) {
  std::string bytes = SafetensorsBytes("{}      ", "");
  absl::StatusOr<uint64_t> length =
      ParseSafetensorsHeaderLength(bytes, bytes.size(), kFile);
  ASSERT_TRUE(length.ok()) << length.status();
  EXPECT_EQ(*length, 8u);
}

TEST(SafetensorsHeaderTest, QuotesUnprintableAndLongNames) {
  EXPECT_EQ(QuoteTensorName("a.b"), "'a.b'");
  EXPECT_EQ(QuoteTensorName(std::string("a\nb", 3)), "'a\\nb'");
  const std::string quoted = QuoteTensorName(std::string(1000, 'x'));
  EXPECT_LT(quoted.size(), 300u);
  EXPECT_THAT(quoted, HasSubstr("1000 bytes"));
}

}  // namespace
}  // namespace mneme::checkpoint
