// The host executor's emulation of staged copies (Executor::StageToDevice):
// they land at AwaitStaged and not before, and work that races them is
// caught, so the host runs of the CUDA backend show the ordering bugs a
// device's copy stream would.

#include "gpu/cuda/host_executor.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "gpu/cuda/executor.h"
#include "gpu/cuda/kernel_ops.h"
#include "gtest/gtest.h"

namespace mneme::gpu {
namespace {

struct Block {
  explicit Block(Executor& e, int64_t n) : executor(e) {
    data = static_cast<float*>(*e.Allocate(n * 4));
  }
  ~Block() { executor.Free(data); }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  Executor& executor;
  float* data;
};

TEST(HostExecutorTest, StagedCopiesLandAtAwaitStagedAndNotBefore) {
  const std::unique_ptr<Executor> e = MakeHostExecutor();
  Block block(*e, 4);
  std::vector<float> src = {1, 2, 3, 4};
  e->StageToDevice(block.data, src.data(), 16);
  src.assign(4, 0.0f);  // The source is free once the call returned.
  std::vector<float> seen(4);
  e->ToHost(seen.data(), block.data, 16);
  for (float v : seen) EXPECT_TRUE(std::isnan(v)) << "landed too early";
  e->AwaitStaged();
  e->ToHost(seen.data(), block.data, 16);
  EXPECT_EQ(seen, (std::vector<float>{1, 2, 3, 4}));
}

TEST(HostExecutorTest, OverlappingStagedCopiesLandInOrder) {
  const std::unique_ptr<Executor> e = MakeHostExecutor();
  Block block(*e, 4);
  const std::vector<float> first = {1, 2, 3, 4}, second = {5, 6};
  e->StageToDevice(block.data, first.data(), 16);
  e->StageToDevice(block.data + 1, second.data(), 8);
  e->AwaitStaged();
  std::vector<float> seen(4);
  e->ToHost(seen.data(), block.data, 16);
  EXPECT_EQ(seen, (std::vector<float>{1, 5, 6, 4}));
}

// Stages a copy into a block, then writes the block before AwaitStaged.
void WriteARacingBlock() {
  const std::unique_ptr<Executor> e = MakeHostExecutor();
  Block a(*e, 4);
  Block b(*e, 4);
  const std::vector<float> src = {1, 2, 3, 4};
  e->StageToDevice(b.data, src.data(), 16);
  e->Run(kernels::AddOp{.a = a.data, .b = a.data, .y = b.data}, 4);
  e->AwaitStaged();
}

TEST(HostExecutorDeathTest, AWriteRacingAStagedCopyStopsTheProcess) {
  EXPECT_DEATH(WriteARacingBlock(), "written before AwaitStaged");
}

}  // namespace
}  // namespace mneme::gpu
