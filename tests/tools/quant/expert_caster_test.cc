#include "tools/quant/expert_caster.h"

#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "checkpoint/checkpoint_index.h"
#include "checkpoint/dtype.h"
#include "checkpoint/sharded_checkpoint.h"
#include "engram_store/engram_checkpoint.h"
#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "formats/ue8m0.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/tools/quant/checkpoint_test_util.h"

namespace mneme::quant {
namespace {

namespace fs = std::filesystem;
using testing::MakeSource;
using testing::ReadFile;
using testing::ReadTree;
using testing::TensorBytes;

// The routed expert weights of the source below: layers 0 and 2 and draft
// stages 0 and 1, three experts each.
std::vector<std::string> ExpertBases() {
  std::vector<std::string> bases;
  for (const char* p : {"layers.0", "layers.2", "mtp.0", "mtp.1"}) {
    for (int e = 0; e < 3; ++e) {
      for (int w = 1; w <= 3; ++w) {
        bases.push_back(std::string(p) + ".ffn.experts." + std::to_string(e) +
                        ".w" + std::to_string(w));
      }
    }
  }
  return bases;
}

std::string MakeExpertSource(const std::string& name) {
  return MakeSource(name, [](synthetic::SyntheticCheckpointOptions& o) {
    o.expert_layer_ids = {0, 2};
    o.draft_stages = 2;
    o.num_routed_experts = 3;
  });
}

// A calibration file with input scale 0.01 x (i + 1) for the i-th weight.
std::string WriteCalibration(const std::string& dir,
                             const std::vector<std::string>& bases,
                             size_t skip = SIZE_MAX) {
  nlohmann::json scales = nlohmann::json::object();
  for (size_t i = 0; i < bases.size(); ++i) {
    if (i != skip) scales[bases[i]] = 0.01 * (i + 1);
  }
  scales["layers.9.ffn.experts.0.w1"] = 1.0;  // Unused entry.
  std::string path = dir + "/calibration.json";
  std::ofstream(path) << nlohmann::json{{"input_scale", scales}}.dump();
  return path;
}

float ReadF32(const std::vector<uint8_t>& bytes) {
  float value = 0;
  EXPECT_EQ(bytes.size(), 4u);
  if (bytes.size() == 4) std::memcpy(&value, bytes.data(), 4);
  return value;
}

int MaxExponent(const std::vector<uint8_t>& scales) {
  int m = 0;
  for (uint8_t s : scales) m = std::max<int>(m, s);
  return m - 127;
}

class ExpertCasterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    source_ = new std::string(MakeExpertSource("experts-src"));
    tree_ = new std::map<std::string, std::string>(ReadTree(*source_));
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(ReadTree(*source_), *tree_);
    delete source_;
    delete tree_;
  }

  static ExpertCastOptions Options(const std::string& out) {
    ExpertCastOptions o;
    o.checkpoint_dir = *source_;
    o.out_dir = out;
    o.threads = 2;
    o.calibration_path =
        WriteCalibration(fs::path(out).parent_path().string(), ExpertBases());
    return o;
  }
  static std::string NewOut(const std::string& name) {
    const std::string dir = mneme::testing::MakeTempDir(name);
    return dir + "/out";
  }

  static std::string* source_;
  static std::map<std::string, std::string>* tree_;
};
std::string* ExpertCasterTest::source_ = nullptr;
std::map<std::string, std::string>* ExpertCasterTest::tree_ = nullptr;

TEST_F(ExpertCasterTest, CastsEveryExpertLosslessly) {
  const std::string out = NewOut("cast");
  absl::StatusOr<nlohmann::json> report = CastExpertsCheckpoint(Options(out));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_FALSE(fs::exists(out + ".partial"));
  EXPECT_EQ(nlohmann::json::parse(ReadFile(out + "/experts-nvfp4.json")),
            *report);

  const std::vector<std::string> bases = ExpertBases();
  auto dst = checkpoint::ShardedCheckpoint::Create(out);
  ASSERT_TRUE(dst.ok()) << dst.status();
  int64_t blocks = 0;
  for (size_t i = 0; i < bases.size(); ++i) {
    const std::string& base = bases[i];
    SCOPED_TRACE(base);
    EXPECT_EQ((*dst)->FindOrNull(base + ".scale"), nullptr);
    const checkpoint::TensorLocation* w = (*dst)->FindOrNull(base + ".weight");
    const checkpoint::TensorLocation* ws =
        (*dst)->FindOrNull(base + ".weight_scale");
    const checkpoint::TensorLocation* ws2 =
        (*dst)->FindOrNull(base + ".weight_scale_2");
    const checkpoint::TensorLocation* is =
        (*dst)->FindOrNull(base + ".input_scale");
    ASSERT_TRUE(w && ws && ws2 && is);
    EXPECT_EQ(w->info->dtype, checkpoint::DType::kU8);
    EXPECT_EQ(ws->info->dtype, checkpoint::DType::kF8E4M3);
    EXPECT_EQ(ws2->info->dtype, checkpoint::DType::kF32);
    EXPECT_TRUE(ws2->info->shape.empty());
    EXPECT_EQ(is->info->dtype, checkpoint::DType::kF32);
    const int64_t rows = w->info->shape[0];
    const int64_t cols = w->info->shape[1] * 2;
    EXPECT_EQ(ws->info->shape, (std::vector<int64_t>{rows, cols / 16}));

    // Nibbles verbatim; values equal; weight_scale_2 from k_max of w1+w3.
    const std::vector<uint8_t> src_w = TensorBytes(*source_, base + ".weight");
    const std::vector<uint8_t> src_s = TensorBytes(*source_, base + ".scale");
    const std::vector<uint8_t> dst_w = TensorBytes(out, base + ".weight");
    const std::vector<uint8_t> dst_s = TensorBytes(out, base + ".weight_scale");
    EXPECT_EQ(dst_w, src_w);
    const std::string expert = base.substr(0, base.size() - 3);
    int k_max = MaxExponent(src_s);
    if (base.back() != '2') {
      k_max =
          std::max(MaxExponent(TensorBytes(*source_, expert + ".w1.scale")),
                   MaxExponent(TensorBytes(*source_, expert + ".w3.scale")));
    }
    const float scale2 = ReadF32(TensorBytes(out, base + ".weight_scale_2"));
    EXPECT_EQ(scale2, std::ldexp(1.0f, k_max - 8));
    EXPECT_EQ(ReadF32(TensorBytes(out, base + ".input_scale")),
              static_cast<float>(0.01 * (i + 1)));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const int nibble = (src_w[(r * cols + c) / 2] >> (4 * (c % 2))) & 0xF;
        const float want =
            formats::E2m1ToFloat(nibble) *
            formats::Ue8m0ToFloat(src_s[r * (cols / 32) + c / 32]);
        const float got =
            (formats::E2m1ToFloat(nibble) *
             formats::E4m3ToFloat(dst_s[r * (cols / 16) + c / 16])) *
            scale2;
        ASSERT_EQ(got, want) << "row " << r << " col " << c;
      }
    }
    blocks += rows * cols / 32;
  }
  // w1 and w3 of an expert share weight_scale_2 even where their own
  // maxima differ (the synthetic w3 runs one power of two above w1).
  EXPECT_EQ(TensorBytes(out, "layers.2.ffn.experts.1.w1.weight_scale_2"),
            TensorBytes(out, "layers.2.ffn.experts.1.w3.weight_scale_2"));

  EXPECT_EQ((*report)["blocks"], blocks);
  EXPECT_EQ((*report)["lossless_blocks"], blocks);
  EXPECT_EQ((*report)["castable_blocks"], blocks);
  EXPECT_EQ((*report)["max_abs_error"], 0.0);
  EXPECT_EQ((*report)["expert_weights"], bases.size());
  EXPECT_EQ((*report)["input_scales"], "calibrated");
  EXPECT_EQ((*report)["calibration_entries_unused"], 1);
  ASSERT_EQ((*report)["layers"].size(), 4u);
  EXPECT_EQ((*report)["layers"][0]["layer"], "layers.0");
  EXPECT_EQ((*report)["layers"][0]["experts"], 3);
  EXPECT_EQ((*report)["layers"][3]["layer"], "mtp.1");
  EXPECT_TRUE((*report)["lossy_blocks"].empty());

  // Everything else unchanged; Engram shards and tokenizer linked.
  auto src = checkpoint::ShardedCheckpoint::Create(*source_);
  ASSERT_TRUE(src.ok());
  uint64_t total = 0;
  for (const auto& [name, loc] : (*dst)->tensors()) {
    total += loc.info->byte_length;
    if (name.find(".ffn.experts.") != std::string::npos) continue;
    EXPECT_EQ(TensorBytes(out, name), TensorBytes(*source_, name)) << name;
  }
  EXPECT_EQ((*dst)->index()->total_size, total);
  struct stat a, b;
  for (const char* linked :
       {"tokenizer.json", "model-00001-of-00005.safetensors"}) {
    ASSERT_EQ(::stat((*source_ + "/" + linked).c_str(), &a), 0);
    ASSERT_EQ(::stat((out + "/" + linked).c_str(), &b), 0);
    EXPECT_EQ(a.st_ino, b.st_ino) << linked;
  }
  const nlohmann::json config =
      nlohmann::json::parse(ReadFile(out + "/config.json"));
  EXPECT_EQ(config["text_config"]["moe_quant_algo"], "NVFP4");
  EXPECT_EQ(config["text_config"]["moe_quant_group_size"], 16);
  const nlohmann::json hf =
      nlohmann::json::parse(ReadFile(out + "/hf_quant_config.json"));
  EXPECT_EQ(hf["quantization"]["quant_algo"], "NVFP4");
  EXPECT_EQ(hf["quantization"]["group_size"], 16);
  EXPECT_EQ(hf["quantization"]["input_scales"], "calibrated");
  // The Engram side still opens.
  EXPECT_TRUE(engram::EngramCheckpoint::Open(out).ok());
}

TEST_F(ExpertCasterTest, UncalibratedIsRecorded) {
  ExpertCastOptions o = Options(NewOut("uncal"));
  o.calibration_path.clear();
  o.input_scales = InputScales::kUncalibrated;
  absl::StatusOr<nlohmann::json> report = CastExpertsCheckpoint(o);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ((*report)["input_scales"], "uncalibrated");
  EXPECT_TRUE((*report)["calibration"].is_null());
  EXPECT_EQ(
      ReadF32(TensorBytes(o.out_dir, "mtp.1.ffn.experts.2.w2.input_scale")),
      1.0f);
  EXPECT_EQ(
      nlohmann::json::parse(ReadFile(
          o.out_dir + "/hf_quant_config.json"))["quantization"]["input_scales"],
      "uncalibrated");
}

TEST_F(ExpertCasterTest, RefusesWithoutCalibrationAndBadCalibrations) {
  ExpertCastOptions o = Options(NewOut("nocal"));
  const std::string calibration = o.calibration_path;
  o.calibration_path.clear();
  absl::Status s = CastExpertsCheckpoint(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--uncalibrated"), absl::string_view::npos) << s;
  o.calibration_path = calibration;
  o.input_scales = InputScales::kUncalibrated;
  EXPECT_EQ(CastExpertsCheckpoint(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.input_scales = InputScales::kCalibrated;
  const std::vector<std::string> bases = ExpertBases();
  o.calibration_path =
      WriteCalibration(mneme::testing::MakeTempDir("partial-cal"), bases, 7);
  s = CastExpertsCheckpoint(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(bases[7]), absl::string_view::npos) << s;
  const std::string bad = mneme::testing::MakeTempDir("bad-cal") + "/c.json";
  std::ofstream(bad) << R"({"input_scale": {"layers.0.ffn.experts.0.w1": -1}})";
  o.calibration_path = bad;
  EXPECT_EQ(CastExpertsCheckpoint(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(o.out_dir + ".partial"));
}

TEST_F(ExpertCasterTest, ReportsUncastableBlocks) {
  const std::string src = MakeExpertSource("uncastable");
  // 25 powers of two below the tensor's largest block: p = -17.
  const std::vector<uint8_t> scales =
      TensorBytes(src, "layers.0.ffn.experts.1.w2.scale");
  const int k_max = MaxExponent(scales);
  testing::PatchTensorByte(src, "layers.0.ffn.experts.1.w2.scale", 5,
                           static_cast<uint8_t>(k_max + 127 - 25));
  ExpertCastOptions o = Options(NewOut("uncastable-out"));
  o.checkpoint_dir = src;
  absl::StatusOr<nlohmann::json> report = CastExpertsCheckpoint(o);
  ASSERT_TRUE(report.ok()) << report.status();
  const int64_t blocks = (*report)["blocks"];
  EXPECT_EQ((*report)["castable_blocks"], blocks - 1);
  EXPECT_EQ((*report)["lossless_blocks"], blocks - 1);
  EXPECT_GT((*report)["max_abs_error"].get<double>(), 0.0);
  ASSERT_EQ((*report)["lossy_blocks"].size(), 1u);
  const nlohmann::json& lossy = (*report)["lossy_blocks"][0];
  EXPECT_EQ(lossy["tensor"], "layers.0.ffn.experts.1.w2.weight");
  // Byte 5 of the [64, 2] scales: row 2, block 1.
  EXPECT_EQ(lossy["row"], 2);
  EXPECT_EQ(lossy["block"], 1);
  EXPECT_EQ(lossy["exponent"], k_max - 25);
  EXPECT_EQ(lossy["power"], -17);
}

TEST_F(ExpertCasterTest, ResumesAfterAnInterruption) {
  const std::string clean = NewOut("clean");
  ASSERT_TRUE(CastExpertsCheckpoint(Options(clean)).ok());
  const std::string out = NewOut("resume");
  ExpertCastOptions o = Options(out);
  o.progress = [](int64_t done, int64_t) {
    return done >= 9 ? absl::CancelledError("stop") : absl::OkStatus();
  };
  EXPECT_EQ(CastExpertsCheckpoint(o).status().code(),
            absl::StatusCode::kCancelled);
  EXPECT_FALSE(fs::exists(out));
  int64_t first_done = -1;
  o.progress = [&](int64_t done, int64_t) {
    if (first_done < 0) first_done = done;
    return absl::OkStatus();
  };
  absl::StatusOr<nlohmann::json> report = CastExpertsCheckpoint(o);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ((*report)["resumed"], true);
  EXPECT_GT(first_done, 9);  // The first shard was not redone.
  std::map<std::string, std::string> a = ReadTree(out), b = ReadTree(clean);
  a.erase("experts-nvfp4.json");
  b.erase("experts-nvfp4.json");
  EXPECT_EQ(a, b);
}

// Bad sources.
struct Damage {
  std::string name;
  std::function<void(const std::string& dir)> apply;
  absl::StatusCode code;
  std::string text;
};

void PrintTo(const Damage& d, std::ostream* os) { *os << d.name; }

class ExpertCasterDamageTest : public ::testing::TestWithParam<Damage> {};

TEST_P(ExpertCasterDamageTest, FailsClearlyAndLeavesTheSourceAlone) {
  const std::string src = MakeExpertSource("damaged");
  GetParam().apply(src);
  const auto before = ReadTree(src);
  ExpertCastOptions o;
  o.checkpoint_dir = src;
  o.out_dir = mneme::testing::MakeTempDir("o") + "/out";
  o.input_scales = InputScales::kUncalibrated;
  const absl::Status s = CastExpertsCheckpoint(o).status();
  EXPECT_EQ(s.code(), GetParam().code) << s;
  EXPECT_NE(s.message().find(GetParam().text), absl::string_view::npos) << s;
  EXPECT_FALSE(fs::exists(o.out_dir));
  EXPECT_FALSE(fs::exists(o.out_dir + ".partial"));
  EXPECT_EQ(ReadTree(src), before);
}

void EditDecl(const std::string& dir, const std::string& tensor,
              const std::function<void(checkpoint::TensorDecl&,
                                       std::vector<uint8_t>&)>& edit) {
  testing::RewriteShard(dir + "/" + testing::ShardOf(dir, tensor),
                        [&](testing::ShardContents& c) {
                          for (checkpoint::TensorDecl& d : c.decls) {
                            if (d.name == tensor) edit(d, c.bytes[d.name]);
                          }
                        });
}

INSTANTIATE_TEST_SUITE_P(
    Sources, ExpertCasterDamageTest,
    ::testing::Values(
        Damage{"NoExperts",
               [](const std::string& d) {
                 for (const std::string& base : ExpertBases()) {
                   testing::RemoveFromIndex(d, base + ".weight");
                   testing::RemoveFromIndex(d, base + ".scale");
                 }
               },
               absl::StatusCode::kInvalidArgument, "no MXFP4 routed experts"},
        Damage{"ExpertsNotMxfp4",
               [](const std::string& d) {
                 EditDecl(
                     d, "mtp.0.ffn.experts.2.w1.weight",
                     [](checkpoint::TensorDecl& decl, std::vector<uint8_t>&) {
                       decl.dtype = checkpoint::DType::kF8E4M3;
                     });
               },
               absl::StatusCode::kInvalidArgument, "F8_E4M3, not MXFP4"},
        Damage{"MissingScale",
               [](const std::string& d) {
                 testing::RemoveFromIndex(d, "layers.2.ffn.experts.0.w3.scale");
               },
               absl::StatusCode::kNotFound, "layers.2.ffn.experts.0.w3.scale"},
        Damage{"ScaleShape",
               [](const std::string& d) {
                 EditDecl(d, "layers.0.ffn.experts.1.w1.scale",
                          [](checkpoint::TensorDecl& decl,
                             std::vector<uint8_t>& bytes) {
                            decl.shape[1] += 1;
                            bytes.resize(decl.shape[0] * decl.shape[1], 120);
                          });
               },
               absl::StatusCode::kDataLoss, "layers.0.ffn.experts.1.w1.scale"},
        Damage{"NanScale",
               [](const std::string& d) {
                 testing::PatchTensorByte(d, "mtp.1.ffn.experts.0.w2.scale", 3,
                                          255);
               },
               absl::StatusCode::kDataLoss, "mtp.1.ffn.experts.0.w2.scale"}),
    [](const ::testing::TestParamInfo<Damage>& info) {
      return info.param.name;
    });

TEST_F(ExpertCasterTest, RefusesAlreadyNvfp4AndBadPaths) {
  const std::string out = NewOut("twice");
  ExpertCastOptions o = Options(out);
  o.calibration_path.clear();
  o.input_scales = InputScales::kUncalibrated;
  ASSERT_TRUE(CastExpertsCheckpoint(o).ok());
  ExpertCastOptions again = o;
  again.checkpoint_dir = out;
  again.out_dir = NewOut("twice-again");
  absl::Status s = CastExpertsCheckpoint(again).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("already has NVFP4"), absl::string_view::npos)
      << s;
  EXPECT_EQ(CastExpertsCheckpoint(o).status().code(),
            absl::StatusCode::kFailedPrecondition);  // out exists
  o.out_dir = *source_;
  EXPECT_EQ(CastExpertsCheckpoint(o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mneme::quant
