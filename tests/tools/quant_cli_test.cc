// Runs `mneme quantize-engram` and `mneme cast-experts` as users do: output
// formats, progress, the report files, refusals, and a full disk simulated
// with a file size limit (RLIMIT_FSIZE) followed by a resume.
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/tools/quant/checkpoint_test_util.h"

namespace mneme {
namespace {

namespace fs = std::filesystem;
using ::mneme::quant::testing::MakeSource;
using ::mneme::quant::testing::ReadFile;
using ::mneme::quant::testing::ReadTree;
using ::mneme::testing::MakeTempDir;
using ::mneme::testing::RunfilePath;
using ::mneme::testing::Subprocess;

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

Result Run(const std::vector<std::string>& argv) {
  auto child = Subprocess::Start(argv);
  EXPECT_TRUE(child.ok()) << child.status();
  if (!child.ok()) return {};
  absl::StatusOr<int> code = (*child)->Wait(absl::Seconds(120));
  EXPECT_TRUE(code.ok()) << code.status();
  return {code.ok() ? *code : -1, (*child)->Stdout(), (*child)->Stderr()};
}

std::string Binary() { return RunfilePath("mneme/tools/mneme"); }

Result Mneme(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {Binary()};
  argv.insert(argv.end(), args.begin(), args.end());
  return Run(argv);
}

// The same under a file size limit of `kib` KiB, with SIGXFSZ ignored so
// that writes past it fail with EFBIG as on a full disk.
Result MnemeWithFileLimit(int kib, const std::vector<std::string>& args) {
  std::string command =
      absl::StrCat("trap '' XFSZ; ulimit -f ", kib * 2, "; exec ", Binary());
  for (const std::string& a : args) absl::StrAppend(&command, " '", a, "'");
  return Run({"/bin/sh", "-c", command});
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

bool Contains(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

class QuantCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    source_ = new std::string(MakeSource("cli-src", [](auto& o) {
      o.expert_layer_ids = {2};
      o.draft_stages = 1;
      o.num_routed_experts = 2;
    }));
  }
  static void TearDownTestSuite() { delete source_; }
  static std::string* source_;
};
std::string* QuantCliTest::source_ = nullptr;

TEST_F(QuantCliTest, QuantizeEngramWritesReportProgressAndVerifies) {
  const std::string out = MakeTempDir("q") + "/out";
  const Result r = Mneme({"quantize-engram", "--checkpoint", *source_, "--out",
                          out, "--method=rtn-mse", "--rows-per-step=1000",
                          "--threads=2", "--verify"});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 4u) << r.out;
  EXPECT_TRUE(Contains(lines[0], "wrote " + out)) << lines[0];
  EXPECT_TRUE(Contains(lines[0], "verified")) << lines[0];
  EXPECT_TRUE(Contains(lines[1], "wkv_rms_%")) << lines[1];
  EXPECT_TRUE(Contains(lines[2], "rtn-mse")) << lines[2];
  // Progress: rows, rows/s and an ETA while running, the time when done.
  EXPECT_TRUE(Contains(r.err, "layer 1 amax: ")) << r.err;
  EXPECT_TRUE(Contains(r.err, "layer 3 quantize: ")) << r.err;
  EXPECT_TRUE(Contains(r.err, "rows/s")) << r.err;
  EXPECT_TRUE(Contains(r.err, "took")) << r.err;
  EXPECT_TRUE(Contains(r.err, "layer 3 verify: ")) << r.err;
  const nlohmann::json report = nlohmann::json::parse(
      ReadFile(out + "/engram-nvfp4.json"), nullptr, false);
  ASSERT_TRUE(report.is_object());
  EXPECT_EQ(report["method"], "rtn-mse");
  EXPECT_EQ(report["verify"]["ok"], true);
  for (const char* key :
       {"layer", "method", "amax", "global_scale", "relative_rms",
        "wkv_relative_rms", "scale_underflows", "rows", "seconds"}) {
    EXPECT_TRUE(report["tables"][0].contains(key)) << key;
  }
  // The Engram CLI reads the result.
  const Result d = Mneme({"engram", "describe", "--checkpoint", out});
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_TRUE(Contains(d.out, "\"nvfp4\"")) << d.out;

  // --verify on a finished output only verifies; without it, refusal.
  const Result v = Mneme(
      {"quantize-engram", "--checkpoint", *source_, "--out", out, "--verify"});
  ASSERT_EQ(v.code, 0) << v.err;
  EXPECT_TRUE(Contains(v.out, "verified " + out)) << v.out;
  const Result again =
      Mneme({"quantize-engram", "--checkpoint", *source_, "--out", out});
  EXPECT_EQ(again.code, 1);
  EXPECT_TRUE(Contains(again.err, "already exists")) << again.err;
}

TEST_F(QuantCliTest, FullDiskFailsCleanlyAndTheRunResumes) {
  const auto before = ReadTree(*source_);
  const std::string out = MakeTempDir("full") + "/out";
  const std::vector<std::string> args = {
      "quantize-engram",    "--checkpoint",         *source_,     "--out", out,
      "--method=gptq-amax", "--rows-per-step=2000", "--threads=2"};
  const Result full = MnemeWithFileLimit(64, args);
  EXPECT_EQ(full.code, 1) << full.out;
  EXPECT_TRUE(Contains(full.err, "File too large")) << full.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(fs::exists(out + ".partial/.mneme-journal.json"));
  EXPECT_EQ(ReadTree(*source_), before);

  const Result resumed = Mneme(args);
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_TRUE(Contains(resumed.out, "resumed")) << resumed.out;
  EXPECT_FALSE(fs::exists(out + ".partial"));

  const std::string clean = MakeTempDir("clean") + "/out";
  std::vector<std::string> clean_args = args;
  clean_args[4] = clean;
  ASSERT_EQ(Mneme(clean_args).code, 0);
  for (const char* f :
       {"model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
        "config.json", "model.safetensors.index.json"}) {
    EXPECT_EQ(ReadFile(out + "/" + f), ReadFile(clean + "/" + f)) << f;
  }
  EXPECT_EQ(ReadTree(*source_), before);
}

TEST_F(QuantCliTest, CastExpertsReportsLosslessBlocksAndCalibration) {
  const std::string dir = MakeTempDir("cast");
  const Result uncal = Mneme({"cast-experts", "--checkpoint", *source_, "--out",
                              dir + "/uncal", "--uncalibrated"});
  ASSERT_EQ(uncal.code, 0) << uncal.err;
  EXPECT_TRUE(Contains(uncal.out, "wrote " + dir + "/uncal")) << uncal.out;
  EXPECT_TRUE(Contains(uncal.out, "blocks lossless")) << uncal.out;
  EXPECT_TRUE(Contains(uncal.out, "max dequantization error 0;")) << uncal.out;
  EXPECT_TRUE(Contains(uncal.out, "input scales uncalibrated")) << uncal.out;
  EXPECT_TRUE(Contains(uncal.err, "expert weights: ")) << uncal.err;
  const nlohmann::json report = nlohmann::json::parse(
      ReadFile(dir + "/uncal/experts-nvfp4.json"), nullptr, false);
  ASSERT_TRUE(report.is_object());
  EXPECT_EQ(report["lossless_blocks"], report["blocks"]);
  EXPECT_EQ(report["input_scales"], "uncalibrated");
  EXPECT_TRUE(fs::exists(dir + "/uncal/hf_quant_config.json"));

  nlohmann::json scales = nlohmann::json::object();
  for (const char* p : {"layers.2", "mtp.0"}) {
    for (int e = 0; e < 2; ++e) {
      for (int w = 1; w <= 3; ++w) {
        scales[absl::StrCat(p, ".ffn.experts.", e, ".w", w)] = 0.25;
      }
    }
  }
  std::ofstream(dir + "/cal.json")
      << nlohmann::json{{"input_scale", scales}}.dump();
  const Result cal =
      Mneme({"cast-experts", "--checkpoint", *source_, "--out", dir + "/cal",
             "--calibration", dir + "/cal.json", "--threads=2"});
  ASSERT_EQ(cal.code, 0) << cal.err;
  EXPECT_TRUE(Contains(cal.out, "input scales calibrated")) << cal.out;
}

struct BadCall {
  std::string name;
  std::vector<std::string> args;  // "SRC" / "OUT" / "NVFP4" are replaced
  std::string expected_text;
};

void PrintTo(const BadCall& bad, std::ostream* os) { *os << bad.name; }

class QuantCliErrorTest : public QuantCliTest,
                          public ::testing::WithParamInterface<BadCall> {
 protected:
  static void SetUpTestSuite() {
    QuantCliTest::SetUpTestSuite();
    nvfp4_ = new std::string(MakeSource("cli-nvfp4", [](auto& o) {
      o.engram_format = formats::RowFormat::kNvfp4;
    }));
  }
  static void TearDownTestSuite() {
    QuantCliTest::TearDownTestSuite();
    delete nvfp4_;
  }
  static std::string* nvfp4_;
};
std::string* QuantCliErrorTest::nvfp4_ = nullptr;

TEST_P(QuantCliErrorTest, ExitsNonZeroWithOneClearLine) {
  const std::string out = MakeTempDir("bad") + "/out";
  std::vector<std::string> args;
  for (const std::string& a : GetParam().args) {
    args.push_back(a == "SRC"     ? *source_
                   : a == "OUT"   ? out
                   : a == "NVFP4" ? *nvfp4_
                                  : a);
  }
  const Result r = Mneme(args);
  EXPECT_EQ(r.code, 1);
  const std::vector<std::string> lines = Lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_TRUE(Contains(lines[0], GetParam().expected_text)) << lines[0];
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".partial"));
}

INSTANTIATE_TEST_SUITE_P(
    BadInput, QuantCliErrorTest,
    ::testing::Values(
        BadCall{"UnknownMethod",
                {"quantize-engram", "--checkpoint", "SRC", "--out", "OUT",
                 "--method=gptq"},
                "expected one of gptq-mse|gptq-amax|rtn-mse|rtn-amax"},
        BadCall{"MissingOut",
                {"quantize-engram", "--checkpoint", "SRC"},
                "--out is required"},
        BadCall{"OutIsSource",
                {"quantize-engram", "--checkpoint", "SRC", "--out", "SRC"},
                "the source checkpoint or inside it"},
        BadCall{"NotFp8",
                {"quantize-engram", "--checkpoint", "NVFP4", "--out", "OUT"},
                "not FP8"},
        BadCall{"ZeroRowsPerStep",
                {"quantize-engram", "--checkpoint", "SRC", "--out", "OUT",
                 "--rows-per-step=0"},
                "--rows-per-step=0"},
        BadCall{"NoSource",
                {"quantize-engram", "--checkpoint", "/nonexistent/ckpt",
                 "--out", "OUT"},
                "/nonexistent/ckpt"},
        BadCall{"CastWithoutCalibration",
                {"cast-experts", "--checkpoint", "SRC", "--out", "OUT"},
                "--calibration FILE.json is required"},
        BadCall{"CastBothCalibrations",
                {"cast-experts", "--checkpoint", "SRC", "--out", "OUT",
                 "--calibration=/x.json", "--uncalibrated"},
                "exclude each other"},
        BadCall{"CastWithoutExperts",
                {"cast-experts", "--checkpoint", "NVFP4", "--out", "OUT",
                 "--uncalibrated"},
                "no MXFP4 routed experts"},
        BadCall{"CastMissingCalibrationFile",
                {"cast-experts", "--checkpoint", "SRC", "--out", "OUT",
                 "--calibration=/nonexistent/cal.json"},
                "/nonexistent/cal.json"}),
    [](const ::testing::TestParamInfo<BadCall>& info) {
      return info.param.name;
    });

}  // namespace
}  // namespace mneme
