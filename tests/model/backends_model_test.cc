// The whole model on the CUDA backend's kernels against the CPU backend, on
// the tiny real-layout checkpoints of both architectures: every prompt
// position's logits within a stated tolerance and the same greedy tokens.
// The kernels run on the host executor everywhere and, under --config=cuda,
// on every GPU present.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gpu/backend.h"
#include "gpu/cuda/cuda_backend.h"
#include "gpu/cuda/host_executor.h"
#include "gpu/cuda/kernel_backend.h"
#include "gpu/device_info.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "services/worker/local_model.h"
#include "tools/synthetic/release_checkpoint.h"

namespace mneme::model {
namespace {

using worker::LocalModel;
using worker::LocalModelOptions;

// |kernels - cpu| <= kTolerance * (1 + |cpu|) for every logit: the two
// backends sum in different orders (fp32), nothing else differs.
constexpr float kTolerance = 2e-3f;

std::string MakeTiny(synthetic::ReleaseArch arch, const std::string& name) {
  std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/tiny-", name);
  synthetic::ReleaseCheckpointOptions o;
  o.out_dir = dir;
  o.arch = arch;
  o.seed = 5;
  o.threads = 1;
  const absl::Status st = synthetic::MakeReleaseCheckpoint(o);
  EXPECT_TRUE(st.ok()) << st;
  return dir;
}

absl::StatusOr<std::unique_ptr<LocalModel>> Open(
    const std::string& dir,
    std::function<absl::StatusOr<std::unique_ptr<gpu::Backend>>()> make) {
  LocalModelOptions o;
  o.checkpoint_dir = dir;
  o.threads = 1;
  o.make_backend = std::move(make);
  o.model.kv_cache.budget_bytes = 32 << 20;
  return LocalModel::Create(o);
}

SequenceChunk Chunk(std::vector<int64_t> tokens, int64_t start,
                    SequenceChunk::Logits logits) {
  SequenceChunk c;
  c.sequence_id = 1;
  c.tokens = std::move(tokens);
  c.start_position = start;
  c.logits = logits;
  return c;
}

// The logits of a 96-token prompt (every position), then of 6 greedy decode
// steps, and the tokens chosen. 96 tokens are more entries than the tiny
// checkpoints' index_topk (16) on every compressed layer (24 at ratio 4),
// so the indexer's choice drops entries (Backend::SelectTopK) and V4.1's
// candidate blocks restrict it.
struct Generation {
  std::vector<float> logits;
  std::vector<int64_t> greedy;
};

Generation Generate(Model& model) {
  Generation run;
  std::vector<int64_t> prompt(96);
  for (int i = 0; i < 96; ++i) prompt[i] = 3 + (i * 37 + 11) % 500;
  StepInput in;
  in.chunks.push_back(Chunk(prompt, 0, SequenceChunk::Logits::kAll));
  absl::StatusOr<StepOutput> out = model.Step(in);
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return run;
  const int64_t vocab = model.dims().vocab_size;
  int64_t position = static_cast<int64_t>(prompt.size());
  for (int step = 0; step <= 6; ++step) {
    const std::vector<float>& l = out->logits[0];
    run.logits.insert(run.logits.end(), l.begin(), l.end());
    const auto last = l.end() - vocab;
    const int64_t next = std::max_element(last, l.end()) - last;
    run.greedy.push_back(next);
    if (step == 6) break;
    StepInput decode;
    decode.chunks.push_back(
        Chunk({next}, position++, SequenceChunk::Logits::kLast));
    out = model.Step(decode);
    EXPECT_TRUE(out.ok()) << out.status();
    if (!out.ok()) return run;
  }
  return run;
}

struct Case {
  std::string name;
  synthetic::ReleaseArch arch;
  std::function<absl::StatusOr<std::unique_ptr<gpu::Backend>>()> make;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  std::vector<
      std::pair<std::string,
                std::function<absl::StatusOr<std::unique_ptr<gpu::Backend>>()>>>
      backends;
  backends.emplace_back(
      "kernels_host", []() -> absl::StatusOr<std::unique_ptr<gpu::Backend>> {
        return std::make_unique<gpu::KernelBackend>(gpu::MakeHostExecutor());
      });
  if (absl::StatusOr<std::vector<gpu::DeviceInfo>> devices = gpu::ListDevices();
      devices.ok()) {
    for (const gpu::DeviceInfo& d : *devices) {
      const int index = d.index;
      backends.emplace_back(absl::StrCat("cuda_", index), [index]() {
        return gpu::CreateCudaBackend(index);
      });
    }
  } else if (gpu::BuiltWithCuda()) {
    // Listed, and skipped with the reason.
    backends.emplace_back("cuda_none",
                          [reason = devices.status()]()
                              -> absl::StatusOr<std::unique_ptr<gpu::Backend>> {
                            return reason;
                          });
  }
  for (const auto& [name, make] : backends) {
    cases.push_back({absl::StrCat("V4Flash_", name),
                     synthetic::ReleaseArch::kV4Flash, make});
    cases.push_back({absl::StrCat("V41Flash_", name),
                     synthetic::ReleaseArch::kV41Flash, make});
  }
  // A device that reads the Engram rows' pinned staging in place (GB10)
  // instead of copying them: V4.1's Engram layers.
  cases.push_back(
      {"V41Flash_kernels_host_in_place", synthetic::ReleaseArch::kV41Flash,
       []() -> absl::StatusOr<std::unique_ptr<gpu::Backend>> {
         return std::make_unique<gpu::KernelBackend>(
             gpu::MakeHostExecutor({.reads_pinned_in_place = true}));
       }});
  return cases;
}

class BackendsModelTest : public ::testing::TestWithParam<Case> {};

TEST_P(BackendsModelTest, LogitsAndGreedyTokensMatchTheCpuBackend) {
  if (absl::StatusOr<std::unique_ptr<gpu::Backend>> probe = GetParam().make();
      absl::IsUnavailable(probe.status())) {
    GTEST_SKIP() << probe.status();
  }
  const std::string dir = MakeTiny(GetParam().arch, GetParam().name);
  absl::StatusOr<std::unique_ptr<LocalModel>> cpu = Open(dir, nullptr);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  absl::StatusOr<std::unique_ptr<LocalModel>> other =
      Open(dir, GetParam().make);
  ASSERT_TRUE(other.ok()) << other.status();
  const Generation want = Generate((*cpu)->model());
  const Generation got = Generate((*other)->model());
  ASSERT_EQ(got.logits.size(), want.logits.size());
  ASSERT_FALSE(want.logits.empty());
  int64_t bad = 0;
  float worst = 0.0f;
  for (size_t i = 0; i < want.logits.size(); ++i) {
    const float err = std::fabs(got.logits[i] - want.logits[i]) /
                      (1.0f + std::fabs(want.logits[i]));
    worst = std::max(worst, err);
    if (!(err <= kTolerance)) ++bad;
  }
  EXPECT_EQ(bad, 0) << "worst relative error " << worst;
  EXPECT_EQ(got.greedy, want.greedy);
}

// Where the device reads the Engram rows' staging in place (GB10; the CPU
// backend), the model sets no workspace aside for copies of them: the
// arena at load is smaller than on a device that copies them, and the
// same as the CPU backend's. The backends' claims: pinned staging on such
// a device is read in place, ordinary memory is copied, and a device that
// copies reads no staging in place.
TEST(BackendsModelWorkspaceTest,
     NoRoomForEngramCopiesWhereStagingIsReadInPlace) {
  auto in_place = []() -> absl::StatusOr<std::unique_ptr<gpu::Backend>> {
    return std::make_unique<gpu::KernelBackend>(
        gpu::MakeHostExecutor({.reads_pinned_in_place = true}));
  };
  auto copying = []() -> absl::StatusOr<std::unique_ptr<gpu::Backend>> {
    return std::make_unique<gpu::KernelBackend>(gpu::MakeHostExecutor());
  };
  for (const bool reads_in_place : {true, false}) {
    // The staging is freed before its backend.
    std::unique_ptr<gpu::Backend> b =
        *(reads_in_place ? in_place() : copying());
    EXPECT_EQ(b->ReadsAllocatedStagingInPlace(), reads_in_place);
    absl::StatusOr<std::unique_ptr<gpu::HostStaging>> pinned =
        b->AllocateHostStaging(16);
    ASSERT_TRUE(pinned.ok()) << pinned.status();
    EXPECT_EQ(b->ReadsStagingInPlace(**pinned), reads_in_place);
    EXPECT_FALSE(b->ReadsStagingInPlace(gpu::HostMemoryStaging(16)));
  }
  const std::string dir =
      MakeTiny(synthetic::ReleaseArch::kV41Flash, "engram_workspace");
  absl::StatusOr<std::unique_ptr<LocalModel>> cpu = Open(dir, nullptr);
  absl::StatusOr<std::unique_ptr<LocalModel>> gb10 = Open(dir, in_place);
  absl::StatusOr<std::unique_ptr<LocalModel>> discrete = Open(dir, copying);
  ASSERT_TRUE(cpu.ok() && gb10.ok() && discrete.ok());
  ASSERT_FALSE((*gb10)->model().dims().engram_layers.empty());
  EXPECT_LT((*gb10)->model().workspace_floats(),
            (*discrete)->model().workspace_floats());
  EXPECT_EQ((*gb10)->model().workspace_floats(),
            (*cpu)->model().workspace_floats());
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendsModelTest,
                         ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return i.param.name;
                         });

}  // namespace
}  // namespace mneme::model
