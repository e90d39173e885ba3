// CheckCheckpointLoads on full-shape checkpoints of the releases (headers
// real, data left as holes): they load as released, and a missing tensor or
// a shape that does not match is named.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gpu/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "nlohmann/json.hpp"
#include "tools/synthetic/release_checkpoint.h"

namespace mneme::model {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string FullShapes(synthetic::ReleaseArch arch) {
  std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/full-",
                                 synthetic::ReleaseArchName(arch));
  if (fs::exists(dir + "/config.json")) return dir;
  synthetic::ReleaseCheckpointOptions o;
  o.out_dir = dir;
  o.arch = arch;
  o.full_shapes = true;
  const absl::Status st = synthetic::MakeReleaseCheckpoint(o);
  EXPECT_TRUE(st.ok()) << st;
  return dir;
}

// A copy whose index or config is edited: the JSON files copied, the shards
// linked (copying a sparse shard would write its holes out in full).
std::string Copy(const std::string& from, const std::string& name) {
  std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const fs::directory_entry& e : fs::directory_iterator(from)) {
    const fs::path to = fs::path(dir) / e.path().filename();
    if (e.path().extension() == ".safetensors") {
      fs::create_symlink(fs::absolute(e.path()), to);
    } else {
      fs::copy_file(e.path(), to);
    }
  }
  return dir;
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

void WriteJson(const std::string& path, const nlohmann::json& j) {
  std::ofstream(path) << j.dump(2);
}

class CheckCheckpointLoadsTest
    : public ::testing::TestWithParam<synthetic::ReleaseArch> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<gpu::CpuBackend>> b =
        gpu::CpuBackend::Create({.threads = 1});
    ASSERT_TRUE(b.ok());
    backend_ = *std::move(b);
  }
  std::unique_ptr<gpu::CpuBackend> backend_;
};

TEST_P(CheckCheckpointLoadsTest, TheReleaseLoadsAtTp1And4) {
  const std::string dir = FullShapes(GetParam());
  for (const int tp : {1, 4}) {
    const absl::Status st = CheckCheckpointLoads(dir, tp, *backend_);
    EXPECT_TRUE(st.ok()) << "tp " << tp << ": " << st;
  }
  // 3 divides neither the heads nor the experts.
  EXPECT_EQ(CheckCheckpointLoads(dir, 3, *backend_).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(CheckCheckpointLoadsTest, AMissingTensorIsNamed) {
  const std::string dir = Copy(FullShapes(GetParam()), "missing");
  const std::string index = dir + "/model.safetensors.index.json";
  nlohmann::json j = ReadJson(index);
  for (const char* name :
       {"layers.3.attn.wq_b.weight", "mtp.0.ffn.experts.1.w2.weight"}) {
    nlohmann::json edited = j;
    edited["weight_map"].erase(name);
    WriteJson(index, edited);
    const absl::Status st = CheckCheckpointLoads(dir, 1, *backend_);
    EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
    EXPECT_THAT(st.message(), HasSubstr(name));
  }
}

TEST_P(CheckCheckpointLoadsTest, AShapeThatDoesNotMatchIsNamed) {
  const std::string dir = Copy(FullShapes(GetParam()), "shape");
  nlohmann::json config = ReadJson(dir + "/config.json");
  nlohmann::json& keys =
      config.contains("text_config") ? config["text_config"] : config;
  keys["moe_intermediate_size"] = keys["moe_intermediate_size"].get<int>() * 2;
  WriteJson(dir + "/config.json", config);
  const absl::Status st = CheckCheckpointLoads(dir, 1, *backend_);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(st.message(), HasSubstr("ffn.experts.0.w1.weight"));
  EXPECT_THAT(st.message(), HasSubstr("has shape"));
}

INSTANTIATE_TEST_SUITE_P(
    Releases, CheckCheckpointLoadsTest,
    ::testing::Values(synthetic::ReleaseArch::kV4Flash,
                      synthetic::ReleaseArch::kV4Flash0731,
                      synthetic::ReleaseArch::kV41Flash),
    [](const ::testing::TestParamInfo<synthetic::ReleaseArch>& i) {
      switch (i.param) {
        case synthetic::ReleaseArch::kV4Flash:
          return std::string("V4Flash");
        case synthetic::ReleaseArch::kV4Flash0731:
          return std::string("V4Flash0731");
        case synthetic::ReleaseArch::kV41Flash:
          return std::string("V41Flash");
      }
      return std::string("unknown");
    });

}  // namespace
}  // namespace mneme::model
