// Runs the mneme binary as users do and checks the public output formats of
// make-checkpoint, inspect and engram describe/ids/rows, and its errors.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engram_store/engram_checkpoint.h"
#include "formats/row_decode.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/command.h"
#include "tests/testing/subprocess.h"

namespace mneme {
namespace {

using Result = ::mneme::testing::CommandResult;

Result Mneme(const std::vector<std::string>& args) {
  return ::mneme::testing::RunMneme(args);
}

std::vector<std::string> Lines(const std::string& text) {
  return ::mneme::testing::NonEmptyLines(text);
}

class MnemeCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testing::MakeTempDir("cli") + "/ckpt");
    const Result r = Mneme({"make-checkpoint", "--out", *dir_,
                            "--engram-format=nvfp4", "--seed=5"});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("wrote " + *dir_), std::string::npos) << r.out;
  }
  static std::string* dir_;
};
std::string* MnemeCliTest::dir_ = nullptr;

TEST_F(MnemeCliTest, InspectListsTensorsAndEngramConfig) {
  const Result r = Mneme({"inspect", *dir_});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* want :
       {"layers.1.engram.embed.weight", "U8", "layers.3.engram.embed.scale",
        "F8_E4M3", "model-00002-of-00002.safetensors", "format", "nvfp4",
        "compressed vocabulary", "global scale"}) {
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  }
}

TEST_F(MnemeCliTest, DescribeIsJsonWithTheHashingConstants) {
  const Result r = Mneme({"engram", "describe", "--checkpoint", *dir_});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(json.is_discarded()) << r.out;
  ASSERT_EQ(json["layers"].size(), 2u);
  auto c = engram::EngramCheckpoint::Open(*dir_);
  ASSERT_TRUE(c.ok());
  for (int i = 0; i < 2; ++i) {
    const nlohmann::json& layer = json["layers"][i];
    const engram::LayerHashLayout& l = (*c)->hasher().layout().layers()[i];
    EXPECT_EQ(layer["layer"], l.layer_id);
    EXPECT_EQ(layer["rows"], l.num_rows);
    EXPECT_EQ(layer["format"], "nvfp4");
    EXPECT_EQ(layer["multipliers"].get<std::vector<int64_t>>(), l.multipliers);
    EXPECT_EQ(layer["primes"].size(), 24u);
    EXPECT_EQ(layer["primes"].get<std::vector<int64_t>>(), l.primes);
    EXPECT_EQ(layer["offsets"].get<std::vector<int64_t>>(), l.offsets);
    EXPECT_EQ(layer["compressed_vocab_size"],
              (*c)->config().compressed_vocab_size);
    EXPECT_GT(layer["global_scale"].get<double>(), 0.0);
  }
}

TEST_F(MnemeCliTest, IdsPrintTheRowIdsOfEveryPosition) {
  const std::vector<int64_t> tokens = {0, 300, 301, 5, 302, 303, 300};
  const Result r = Mneme({"engram", "ids", "--checkpoint", *dir_, "--layer=3",
                          "--tokens", absl::StrJoin(tokens, ",")});
  ASSERT_EQ(r.code, 0) << r.err;
  auto c = engram::EngramCheckpoint::Open(*dir_);
  ASSERT_TRUE(c.ok());
  absl::StatusOr<std::vector<int64_t>> want =
      (*c)->hasher().RowIds(3, {}, tokens);
  ASSERT_TRUE(want.ok());
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), tokens.size());
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::vector<std::string> fields = absl::StrSplit(lines[t], ' ');
    ASSERT_EQ(fields.size(), 24u);
    for (size_t col = 0; col < 24; ++col) {
      EXPECT_EQ(fields[col], absl::StrCat((*want)[t * 24 + col]));
    }
  }
}

TEST_F(MnemeCliTest, RowsPrintTheDecodedValues) {
  auto c = engram::EngramCheckpoint::Open(*dir_);
  ASSERT_TRUE(c.ok());
  const int64_t last = (*c)->tables()[0].rows - 1;
  const std::vector<int64_t> ids = {0, 17, last, 17};
  const Result r = Mneme({"engram", "rows", "--checkpoint", *dir_, "--layer=1",
                          "--ids", absl::StrJoin(ids, ",")});
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<uint8_t> raw(ids.size() * 144);
  ASSERT_TRUE((*c)->ReadRawRows(1, ids, absl::MakeSpan(raw)).ok());
  std::vector<float> want(ids.size() * 256);
  ASSERT_TRUE(
      formats::DecodeRowsF32({.format = formats::RowFormat::kNvfp4,
                              .global_scale = (*c)->tables()[0].global_scale},
                             raw, absl::MakeSpan(want))
          .ok());
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), ids.size());
  for (size_t row = 0; row < ids.size(); ++row) {
    const std::vector<std::string> fields = absl::StrSplit(lines[row], ' ');
    ASSERT_EQ(fields.size(), 256u);
    for (size_t i = 0; i < 256; ++i) {
      float value = 0;
      ASSERT_TRUE(absl::SimpleAtof(fields[i], &value)) << fields[i];
      // %.9g round-trips fp32 exactly.
      EXPECT_EQ(value, want[row * 256 + i]) << "row " << ids[row] << " " << i;
    }
  }
  EXPECT_EQ(lines[1], lines[3]);
}

struct BadCall {
  std::string name;
  std::vector<std::string> args;
  std::string expected_text;
};

void PrintTo(const BadCall& bad, std::ostream* os) { *os << bad.name; }

class MnemeCliErrorTest : public MnemeCliTest,
                          public ::testing::WithParamInterface<BadCall> {};

TEST_P(MnemeCliErrorTest, ExitsNonZeroWithOneClearLine) {
  std::vector<std::string> args;
  for (const std::string& a : GetParam().args) {
    args.push_back(a == "CKPT" ? *dir_ : a);
  }
  const Result r = Mneme(args);
  EXPECT_NE(r.code, 0);
  const std::vector<std::string> lines = Lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_NE(lines[0].find(GetParam().expected_text), std::string::npos)
      << lines[0];
}

INSTANTIATE_TEST_SUITE_P(
    BadInput, MnemeCliErrorTest,
    ::testing::Values(
        BadCall{"UnknownCommand", {"frobnicate"}, "unknown command"},
        BadCall{"UnknownFlag",
                {"engram", "ids", "--checkpoint=CKPT", "--bogus=1"},
                "unknown flag --bogus"},
        BadCall{"MissingCheckpoint",
                {"engram", "describe"},
                "--checkpoint is required"},
        BadCall{"NoSuchDirectory",
                {"engram", "describe", "--checkpoint=/nonexistent/ckpt"},
                "/nonexistent/ckpt"},
        BadCall{"NotAnEngramLayer",
                {"engram", "ids", "--checkpoint", "CKPT", "--layer=2",
                 "--tokens=1,2"},
                "layer 2"},
        BadCall{"TokenOutOfVocabulary",
                {"engram", "ids", "--checkpoint", "CKPT", "--layer=1",
                 "--tokens=1,99999999"},
                "99999999"},
        BadCall{"MalformedTokens",
                {"engram", "ids", "--checkpoint", "CKPT", "--layer=1",
                 "--tokens=1,x"},
                "'x' is not an integer"},
        BadCall{"RowOutOfRange",
                {"engram", "rows", "--checkpoint", "CKPT", "--layer=1",
                 "--ids=0,999999999"},
                "row id 999999999 outside layer 1's table"},
        BadCall{
            "NegativeRow",
            {"engram", "rows", "--checkpoint", "CKPT", "--layer=1", "--ids=-1"},
            "row id -1"},
        BadCall{"MakeCheckpointIntoExisting",
                {"make-checkpoint", "--out", "CKPT"},
                "exists and is not an empty directory"},
        BadCall{"BadFormat",
                {"make-checkpoint", "--out=/tmp/x", "--engram-format=fp16"},
                "expected one of fp8|nvfp4"},
        BadCall{"InspectNeedsADirectory", {"inspect"}, "usage: mneme inspect"}),
    [](const ::testing::TestParamInfo<BadCall>& info) {
      return info.param.name;
    });

TEST(MnemeCliExpertsTest, MakeCheckpointWithMxfp4ExpertsAndDraftStages) {
  const std::string dir = testing::MakeTempDir("cli-experts") + "/ckpt";
  const Result made =
      Mneme({"make-checkpoint", "--out", dir, "--expert-layers=0,2",
             "--draft-stages=1", "--experts=3", "--wkv=correlated"});
  ASSERT_EQ(made.code, 0) << made.err;
  const Result r = Mneme({"inspect", dir});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* want :
       {"layers.0.ffn.experts.0.w1.weight", "layers.2.ffn.experts.2.w3.scale",
        "mtp.0.ffn.experts.0.w2.weight", "F8_E8M0"}) {
    EXPECT_NE(r.out.find(want), std::string::npos) << want;
  }
  EXPECT_EQ(r.out.find("experts.3."), std::string::npos);
  const Result bad = Mneme({"make-checkpoint", "--out", dir + "2", "--wkv=x"});
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("expected one of independent|correlated"),
            std::string::npos)
      << bad.err;
}

TEST(MnemeCliCorruptTest, CompressedVocabularyMismatchIsRefused) {
  const std::string dir = testing::MakeTempDir("cli-bad") + "/ckpt";
  ASSERT_EQ(Mneme({"make-checkpoint", "--out", dir}).code, 0);
  std::ifstream in(dir + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in, nullptr, false);
  in.close();
  const int64_t real = config["text_config"]["engram_compressed_vocab_size"];
  config["text_config"]["engram_compressed_vocab_size"] = real + 1;
  std::ofstream(dir + "/config.json") << config.dump(2);
  const Result r = Mneme({"engram", "describe", "--checkpoint", dir});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(absl::StrCat(real)), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(absl::StrCat(real + 1)), std::string::npos) << r.err;
}

TEST(MnemeCliCorruptTest, TruncatedShardIsDataLoss) {
  const std::string dir = testing::MakeTempDir("cli-trunc") + "/ckpt";
  ASSERT_EQ(Mneme({"make-checkpoint", "--out", dir}).code, 0);
  const std::string shard = dir + "/model-00002-of-00002.safetensors";
  ASSERT_EQ(truncate(shard.c_str(), 4096), 0);
  const Result r = Mneme({"inspect", dir});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("model-00002-of-00002.safetensors"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace mneme
