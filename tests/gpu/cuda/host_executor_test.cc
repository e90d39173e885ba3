// The host executor's emulation of staged copies (Executor::StageToDevice):
// they land at AwaitStaged and not before, and work that races them (or a
// write to their pinned source) is caught, so the host runs of the CUDA
// backend show the ordering bugs a device's copy stream would; and of a
// device that reads pinned memory in place (Executor::PinnedForDevice),
// where a write before Synchronize is caught.

#include "gpu/cuda/host_executor.h"

#include <algorithm>
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

// Pinned host memory holding `values`.
struct Pinned {
  Pinned(Executor& e, const std::vector<float>& values) : executor(e) {
    data = static_cast<float*>(
        *e.AllocatePinned(static_cast<int64_t>(values.size()) * 4));
    std::copy(values.begin(), values.end(), data);
  }
  ~Pinned() { executor.FreePinned(data); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  Executor& executor;
  float* data;
};

TEST(HostExecutorTest, StagedCopiesLandAtAwaitStagedAndNotBefore) {
  const std::unique_ptr<Executor> e = MakeHostExecutor();
  Block block(*e, 4);
  Pinned src(*e, {1, 2, 3, 4});
  e->StageToDevice(block.data, src.data, 16);
  std::vector<float> seen(4);
  e->ToHost(seen.data(), block.data, 16);
  for (float v : seen) EXPECT_TRUE(std::isnan(v)) << "landed too early";
  e->AwaitStaged();
  e->ToHost(seen.data(), block.data, 16);
  EXPECT_EQ(seen, (std::vector<float>{1, 2, 3, 4}));
  // The source is free once synchronized.
  ASSERT_TRUE(e->Synchronize().ok());
  src.data[0] = 9;
  ASSERT_TRUE(e->Synchronize().ok());
  e->ToHost(seen.data(), block.data, 16);
  EXPECT_EQ(seen, (std::vector<float>{1, 2, 3, 4}));
}

TEST(HostExecutorTest, OverlappingStagedCopiesLandInOrder) {
  const std::unique_ptr<Executor> e = MakeHostExecutor();
  Block block(*e, 4);
  Pinned first(*e, {1, 2, 3, 4});
  Pinned second(*e, {5, 6});
  e->StageToDevice(block.data, first.data, 16);
  e->StageToDevice(block.data + 1, second.data, 8);
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
  Pinned src(*e, {1, 2, 3, 4});
  e->StageToDevice(b.data, src.data, 16);
  e->Run(kernels::AddOp{.a = a.data, .b = a.data, .y = b.data}, 4);
  e->AwaitStaged();
}

TEST(HostExecutorDeathTest, AWriteRacingAStagedCopyStopsTheProcess) {
  EXPECT_DEATH(WriteARacingBlock(), "written before AwaitStaged");
}

// Stages a copy from pinned memory, then writes that memory before
// AwaitStaged (the device's copy may still be reading it).
void WriteARacingSource() {
  const std::unique_ptr<Executor> e = MakeHostExecutor();
  Block b(*e, 4);
  Pinned src(*e, {1, 2, 3, 4});
  e->StageToDevice(b.data, src.data, 16);
  src.data[3] = 0;
  e->AwaitStaged();
}

// The same after AwaitStaged, before Synchronize (a device's copy may
// still be reading it).
void WriteALandedCopysSourceBeforeSynchronize() {
  const std::unique_ptr<Executor> e = MakeHostExecutor();
  Block b(*e, 4);
  Pinned src(*e, {1, 2, 3, 4});
  e->StageToDevice(b.data, src.data, 16);
  e->AwaitStaged();
  src.data[3] = 0;
  (void)e->Synchronize();
}

TEST(HostExecutorDeathTest, AWriteToAStagedCopysSourceStopsTheProcess) {
  EXPECT_DEATH(WriteARacingSource(), "source of a staged copy was written");
  EXPECT_DEATH(WriteALandedCopysSourceBeforeSynchronize(),
               "may still read was written before Synchronize");
}

TEST(HostExecutorTest, InPlaceReadsSeeThePinnedMemoryItself) {
  const std::unique_ptr<Executor> e =
      MakeHostExecutor({.reads_pinned_in_place = true});
  ASSERT_TRUE(e->ReadsPinnedInPlace());
  EXPECT_FALSE(MakeHostExecutor()->ReadsPinnedInPlace());
  Pinned src(*e, {1, 2, 3, 4});
  const auto* view =
      static_cast<const float*>(e->PinnedForDevice(src.data, 16));
  ASSERT_EQ(view, src.data);
  Block sum(*e, 4);
  e->Run(kernels::AddOp{.a = view, .b = view, .y = sum.data}, 4);
  ASSERT_TRUE(e->Synchronize().ok());
  std::vector<float> seen(4);
  e->ToHost(seen.data(), sum.data, 16);
  EXPECT_EQ(seen, (std::vector<float>{2, 4, 6, 8}));
  // Free for the next step once synchronized.
  src.data[0] = 5;
  view = static_cast<const float*>(e->PinnedForDevice(src.data, 16));
  e->Run(kernels::AddOp{.a = view, .b = view, .y = sum.data}, 4);
  ASSERT_TRUE(e->Synchronize().ok());
  e->ToHost(seen.data(), sum.data, 16);
  EXPECT_EQ(seen, (std::vector<float>{10, 4, 6, 8}));
}

// Hands pinned memory to the ops in place, then writes it before
// Synchronize (the device may not have read it yet).
void WriteInPlaceMemoryBeforeSynchronize() {
  const std::unique_ptr<Executor> e =
      MakeHostExecutor({.reads_pinned_in_place = true});
  Pinned src(*e, {1, 2, 3, 4});
  e->PinnedForDevice(src.data, 16);
  src.data[1] = 0;
  (void)e->Synchronize();
}

// Asks a device that copies staged memory to read it in place.
void ReadInPlaceOnACopyingDevice() {
  const std::unique_ptr<Executor> e = MakeHostExecutor();
  Pinned src(*e, {1, 2, 3, 4});
  e->PinnedForDevice(src.data, 16);
}

TEST(HostExecutorDeathTest, InPlaceMemoryWrittenBeforeSynchronizeStops) {
  EXPECT_DEATH(WriteInPlaceMemoryBeforeSynchronize(),
               "may still read was written before Synchronize");
  EXPECT_DEATH(ReadInPlaceOnACopyingDevice(), "by a device that copies it");
}

}  // namespace
}  // namespace mneme::gpu
