// The step workspace: scopes give memory back in stack order, zeroed
// sub-buffers are zero, and a step that outgrows the arena is served and
// then fits in one arena.

#include "model/workspace.h"

#include <memory>
#include <vector>

#include "gpu/cpu/cpu_backend.h"
#include "gtest/gtest.h"

namespace mneme::model {
namespace {

std::unique_ptr<gpu::CpuBackend> Backend() {
  absl::StatusOr<std::unique_ptr<gpu::CpuBackend>> b =
      gpu::CpuBackend::Create({});
  EXPECT_TRUE(b.ok()) << b.status();
  return *std::move(b);
}

TEST(WorkspaceTest, ScopesReuseMemoryInStackOrder) {
  std::unique_ptr<gpu::CpuBackend> backend = Backend();
  absl::StatusOr<std::unique_ptr<Workspace>> ws =
      Workspace::Create(*backend, 1024);
  ASSERT_TRUE(ws.ok()) << ws.status();
  Workspace::Scope outer(**ws);
  absl::StatusOr<WorkBuffer> a = (*ws)->Take(10);
  ASSERT_TRUE(a.ok());
  float* first_inner = nullptr;
  {
    Workspace::Scope inner(**ws);
    absl::StatusOr<WorkBuffer> b = (*ws)->Take(100);
    ASSERT_TRUE(b.ok());
    EXPECT_NE(b->data(), a->data());
    EXPECT_EQ((b->data() - a->data()) % Workspace::kAlignFloats, 0);
    first_inner = b->data();
  }
  {
    Workspace::Scope inner(**ws);
    absl::StatusOr<WorkBuffer> c = (*ws)->Take(100);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->data(), first_inner);
  }
  EXPECT_EQ((*ws)->grow_count(), 0);
}

TEST(WorkspaceTest, TakeZeroedIsZeroAfterReuse) {
  std::unique_ptr<gpu::CpuBackend> backend = Backend();
  absl::StatusOr<std::unique_ptr<Workspace>> ws =
      Workspace::Create(*backend, 256);
  ASSERT_TRUE(ws.ok());
  {
    Workspace::Scope scope(**ws);
    absl::StatusOr<WorkBuffer> a = (*ws)->Take(64);
    ASSERT_TRUE(a.ok());
    backend->CopyFromHost(std::vector<float>(64, 7.0f), a->data());
  }
  Workspace::Scope scope(**ws);
  absl::StatusOr<WorkBuffer> z = (*ws)->TakeZeroed(64);
  ASSERT_TRUE(z.ok());
  std::vector<float> host(64, 1.0f);
  backend->CopyToHost(z->data(), absl::MakeSpan(host));
  for (float v : host) EXPECT_EQ(v, 0.0f);
}

TEST(WorkspaceTest, OutgrownArenaServesTheStepThenHoldsItInOneBuffer) {
  std::unique_ptr<gpu::CpuBackend> backend = Backend();
  absl::StatusOr<std::unique_ptr<Workspace>> ws =
      Workspace::Create(*backend, 128);
  ASSERT_TRUE(ws.ok());
  for (int step = 0; step < 3; ++step) {
    Workspace::Scope scope(**ws);
    absl::StatusOr<WorkBuffer> a = (*ws)->Take(100);
    absl::StatusOr<WorkBuffer> b = (*ws)->Take(1000);
    ASSERT_TRUE(a.ok() && b.ok());
    // Both usable at once.
    backend->CopyFromHost(std::vector<float>(100, 1.0f), a->data());
    backend->CopyFromHost(std::vector<float>(1000, 2.0f), b->data());
    std::vector<float> host(100);
    backend->CopyToHost(a->data(), absl::MakeSpan(host));
    EXPECT_EQ(host[99], 1.0f);
  }
  // Grown once (the first step), then every step fits.
  EXPECT_EQ((*ws)->grow_count(), 1);
  EXPECT_GE((*ws)->capacity_floats(), 1100);
}

}  // namespace
}  // namespace mneme::model
