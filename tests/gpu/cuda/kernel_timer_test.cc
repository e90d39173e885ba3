// The CUDA backend's kernel timer (CreateCudaBackend with a timer): the
// arguments are checked everywhere; on a device, only the launches made
// while it is enabled are timed, their device time is positive, Reset
// forgets them, and the backend computes the same with and without timing.

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gpu/backend.h"
#include "gpu/cuda/cuda_backend.h"
#include "gpu/device_info.h"
#include "gtest/gtest.h"

namespace mneme::gpu {
namespace {

TEST(KernelTimerTest, RefusesBadArguments) {
  EXPECT_EQ(CreateCudaBackend(0, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::shared_ptr<KernelTimer> timer;
  EXPECT_EQ(CreateCudaBackend(-1, &timer).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(timer, nullptr);
  if (!BuiltWithCuda()) {
    EXPECT_EQ(CreateCudaBackend(0, &timer).status().code(),
              absl::StatusCode::kUnavailable);
  }
}

TEST(KernelTimerTest, TimesTheLaunchesMadeWhileEnabled) {
  const absl::StatusOr<std::vector<DeviceInfo>> devices = ListDevices();
  if (!devices.ok() || devices->empty()) {
    GTEST_SKIP() << "no CUDA device: "
                 << (devices.ok() ? "none listed" : devices.status().message());
  }
  std::shared_ptr<KernelTimer> timer;
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      CreateCudaBackend(devices->front().index, &timer);
  ASSERT_TRUE(backend.ok()) << backend.status();
  ASSERT_NE(timer, nullptr);
  Backend& b = **backend;
  constexpr int64_t kRows = 64;
  constexpr int64_t kCols = 256;
  std::vector<float> w_values(kRows * kCols);
  std::vector<float> x_values(kCols);
  for (int64_t i = 0; i < kRows * kCols; ++i) {
    w_values[i] = static_cast<float>(i % 7) - 3.0f;
  }
  for (int64_t i = 0; i < kCols; ++i) x_values[i] = static_cast<float>(i % 5);
  std::vector<uint8_t> bytes(w_values.size() * sizeof(float));
  std::memcpy(bytes.data(), w_values.data(), bytes.size());
  HostWeight h;
  h.format = WeightFormat::kF32;
  h.rows = kRows;
  h.cols = kCols;
  h.data = bytes;
  absl::StatusOr<std::unique_ptr<Weight>> w = b.UploadWeight(h);
  ASSERT_TRUE(w.ok()) << w.status();
  absl::StatusOr<std::unique_ptr<Buffer>> x = b.Allocate(kCols);
  absl::StatusOr<std::unique_ptr<Buffer>> y = b.Allocate(kRows);
  ASSERT_TRUE(x.ok() && y.ok());
  b.CopyFromHost(x_values, (*x)->data());
  const auto linear = [&] {
    b.Linear(ConstMatrixView((*x)->data(), 1, kCols), **w,
             MatrixView{(*y)->data(), 1, kRows});
  };
  const auto result = [&] {
    std::vector<float> out(kRows);
    b.CopyToHost((*y)->data(), absl::MakeSpan(out));
    return out;
  };

  linear();  // disabled: not timed
  const std::vector<float> untimed = result();
  EXPECT_EQ(timer->Launches(), 0);
  timer->Enable(true);
  for (int i = 0; i < 5; ++i) linear();
  timer->Enable(false);
  const int64_t launches = timer->Launches();
  EXPECT_GE(launches, 5);  // a Linear is one launch or more
  EXPECT_EQ(launches % 5, 0);
  linear();
  EXPECT_EQ(timer->Launches(), launches);
  const absl::StatusOr<double> seconds = timer->Seconds();
  ASSERT_TRUE(seconds.ok()) << seconds.status();
  EXPECT_GT(*seconds, 0.0);
  // Per kind of kernel: every timed launch once, the most time first, and
  // a one-token Linear's kernel among them.
  const absl::StatusOr<std::vector<KernelTimer::OpTime>> ops = timer->ByOp();
  ASSERT_TRUE(ops.ok()) << ops.status();
  int64_t op_launches = 0;
  double op_seconds = 0.0;
  bool has_linear = false;
  for (size_t i = 0; i < ops->size(); ++i) {
    const KernelTimer::OpTime& op = (*ops)[i];
    EXPECT_FALSE(op.op.empty());
    EXPECT_GT(op.launches, 0);
    if (i > 0) {
      EXPECT_LE(op.seconds, (*ops)[i - 1].seconds);
    }
    op_launches += op.launches;
    op_seconds += op.seconds;
    has_linear = has_linear || op.op == "LinearOp";
  }
  EXPECT_EQ(op_launches, launches);
  EXPECT_NEAR(op_seconds, *seconds, 1e-9 + 1e-6 * *seconds);
  EXPECT_TRUE(has_linear);
  EXPECT_EQ(result(), untimed);
  timer->Reset();
  EXPECT_EQ(timer->Launches(), 0);
  const absl::StatusOr<double> none = timer->Seconds();
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, 0.0);
  ASSERT_TRUE(b.Synchronize().ok());
}

}  // namespace
}  // namespace mneme::gpu
