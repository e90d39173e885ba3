#include "tools/synthetic/synthetic_checkpoint.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engram_store/engram_checkpoint.h"
#include "formats/row_decode.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace mneme::synthetic {
namespace {

using engram::EngramCheckpoint;
using formats::RowFormat;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string Make(RowFormat format, uint64_t seed) {
  SyntheticCheckpointOptions options;
  options.out_dir = testing::MakeTempDir("ckpt") + "/out";
  options.engram_format = format;
  options.seed = seed;
  options.threads = 2;
  const absl::Status status = MakeSyntheticCheckpoint(options);
  EXPECT_TRUE(status.ok()) << status;
  return options.out_dir;
}

std::vector<float> DecodeAll(const EngramCheckpoint& c, int layer,
                             const std::vector<int64_t>& ids) {
  const checkpoint::EngramTableLocation* t = *c.Table(layer);
  std::vector<uint8_t> raw(ids.size() * formats::RowBytes(t->format));
  EXPECT_TRUE(c.ReadRawRows(layer, ids, absl::MakeSpan(raw)).ok());
  std::vector<float> values(ids.size() * formats::kRowDim);
  EXPECT_TRUE(formats::DecodeRowsF32(
                  {.format = t->format, .global_scale = t->global_scale}, raw,
                  absl::MakeSpan(values))
                  .ok());
  return values;
}

class SyntheticCheckpointTest : public ::testing::TestWithParam<RowFormat> {};

TEST_P(SyntheticCheckpointTest, OpensAndIsConsistent) {
  const std::string dir = Make(GetParam(), 7);
  absl::StatusOr<std::unique_ptr<EngramCheckpoint>> c =
      EngramCheckpoint::Open(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  const checkpoint::EngramConfig& config = (*c)->config();
  EXPECT_EQ(config.format, GetParam());
  EXPECT_EQ(config.layer_ids, (std::vector<int>{1, 3}));
  ASSERT_EQ((*c)->tables().size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    // Tens of thousands of rows, as the tests need.
    EXPECT_GT((*c)->tables()[i].rows, 20000);
    EXPECT_EQ((*c)->tables()[i].rows, config.num_embeddings[i]);
  }
  // The compressed vocabulary merges case, accent, width and whitespace
  // variants, so it is clearly smaller than the tokenizer.
  EXPECT_GT(config.compressed_vocab_size, 300);
  EXPECT_LT(config.compressed_vocab_size,
            (*c)->hasher().vocabulary().num_tokens());
  EXPECT_FALSE(std::filesystem::exists(dir + ".partial"));
}

TEST_P(SyntheticCheckpointTest, RowsDecodeCloseToTheGeneratedValues) {
  const std::string dir = Make(GetParam(), 11);
  absl::StatusOr<std::unique_ptr<EngramCheckpoint>> c =
      EngramCheckpoint::Open(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  for (int layer_index = 0; layer_index < 2; ++layer_index) {
    const int layer = (*c)->config().layer_ids[layer_index];
    const int64_t rows = (*c)->tables()[layer_index].rows;
    const std::vector<int64_t> ids = {0, 1, rows / 2, rows - 2, rows - 1};
    const std::vector<float> decoded = DecodeAll(**c, layer, ids);
    double err2 = 0, ref2 = 0;
    std::vector<float> want(formats::kRowDim);
    for (size_t r = 0; r < ids.size(); ++r) {
      SyntheticRowValues(11, layer, ids[r], absl::MakeSpan(want));
      for (int i = 0; i < formats::kRowDim; ++i) {
        const double d = decoded[r * formats::kRowDim + i] - want[i];
        err2 += d * d;
        ref2 += static_cast<double>(want[i]) * want[i];
        EXPECT_LE(std::abs(want[i]), SyntheticTableAmax(layer_index));
      }
    }
    const double relative_rms = std::sqrt(err2 / ref2);
    // FP8 (3 mantissa bits) ~3%; NVFP4 adds its quantization, ~10%.
    EXPECT_LT(relative_rms, GetParam() == RowFormat::kFp8 ? 0.05 : 0.2)
        << "layer " << layer;
    EXPECT_GT(relative_rms, 0.0);
  }
}

TEST_P(SyntheticCheckpointTest, DeterministicPerSeed) {
  const std::string a = Make(GetParam(), 3);
  const std::string b = Make(GetParam(), 3);
  const std::string c = Make(GetParam(), 4);
  for (const char* file :
       {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "config.json", "tokenizer.json", "model.safetensors.index.json"}) {
    EXPECT_EQ(ReadFile(a + "/" + file), ReadFile(b + "/" + file)) << file;
  }
  EXPECT_NE(ReadFile(a + "/model-00001-of-00002.safetensors"),
            ReadFile(c + "/model-00001-of-00002.safetensors"));
}

INSTANTIATE_TEST_SUITE_P(Formats, SyntheticCheckpointTest,
                         ::testing::Values(RowFormat::kFp8, RowFormat::kNvfp4),
                         [](const ::testing::TestParamInfo<RowFormat>& info) {
                           return std::string(
                               formats::RowFormatName(info.param));
                         });

TEST(SyntheticRowValuesTest, HeavyTailed) {
  // Excess kurtosis far above a Gaussian's 0: a few large values per row.
  std::vector<float> row(formats::kRowDim);
  double m2 = 0, m4 = 0;
  int n = 0;
  for (int64_t r = 0; r < 200; ++r) {
    SyntheticRowValues(1, 1, r, absl::MakeSpan(row));
    for (float v : row) {
      m2 += v * v;
      m4 += static_cast<double>(v) * v * v * v;
      ++n;
    }
  }
  m2 /= n;
  m4 /= n;
  EXPECT_GT(m4 / (m2 * m2), 10.0);
}

TEST(SyntheticCheckpointErrorsTest, RefusesANonEmptyDirectory) {
  const std::string dir = testing::MakeTempDir("busy");
  std::ofstream(dir + "/precious.txt") << "keep me";
  SyntheticCheckpointOptions options;
  options.out_dir = dir;
  EXPECT_EQ(MakeSyntheticCheckpoint(options).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReadFile(dir + "/precious.txt"), "keep me");
}

TEST(SyntheticCheckpointErrorsTest, RejectsBadOptions) {
  SyntheticCheckpointOptions options;
  EXPECT_EQ(MakeSyntheticCheckpoint(options).code(),
            absl::StatusCode::kInvalidArgument);
  options.out_dir = testing::MakeTempDir("bad") + "/out";
  options.engram_vocab_size = 5;
  EXPECT_EQ(MakeSyntheticCheckpoint(options).code(),
            absl::StatusCode::kInvalidArgument);
  options.engram_vocab_size = 1000;
  options.hidden_size = 33;
  EXPECT_EQ(MakeSyntheticCheckpoint(options).code(),
            absl::StatusCode::kInvalidArgument);
  options.hidden_size = 64;
  options.engram_layer_ids = {3, 1};
  EXPECT_EQ(MakeSyntheticCheckpoint(options).code(),
            absl::StatusCode::kInvalidArgument);
  options.engram_layer_ids = {1, 9};
  EXPECT_EQ(MakeSyntheticCheckpoint(options).code(),
            absl::StatusCode::kInvalidArgument);
  options.engram_layer_ids = {1};
  options.engram_format = RowFormat::kUnspecified;
  EXPECT_EQ(MakeSyntheticCheckpoint(options).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mneme::synthetic
