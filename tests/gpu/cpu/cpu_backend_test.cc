// What only the CPU backend promises beyond gpu/backend.h; the op cases
// every backend shares are the conformance suite
// (tests/gpu/backend_conformance).

#include "gpu/cpu/cpu_backend.h"

#include <memory>
#include <random>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu/backend.h"
#include "gtest/gtest.h"
#include "tests/gpu/backend_conformance/conformance_test_base.h"

namespace mneme::gpu {
namespace {

using conformance::Encode;
using conformance::EncodedWeight;

TEST(CpuBackendCreateTest, RejectsBadThreadCounts) {
  for (int threads : {-1, kMaxCpuBackendThreads + 1}) {
    EXPECT_EQ(CpuBackend::Create(CpuBackendOptions{.threads = threads})
                  .status()
                  .code(),
              absl::StatusCode::kInvalidArgument);
  }
  absl::StatusOr<std::unique_ptr<CpuBackend>> backend =
      CpuBackend::Create(CpuBackendOptions{});
  ASSERT_TRUE(backend.ok());
  EXPECT_GE((*backend)->threads(), 1);
  EXPECT_EQ((*backend)->name(), "cpu");
  EXPECT_STRNE(CpuBackend::SimdTargetName(), "");
  EXPECT_TRUE((*backend)->Synchronize().ok());
}

// CpuBackend dequantizes every format to fp32 (cpu_backend.h).
class CpuBackendTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<CpuBackend>> backend =
        CpuBackend::Create(CpuBackendOptions{.threads = GetParam()});
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
  }

  std::unique_ptr<Weight> MustUpload(const HostWeight& host) {
    absl::StatusOr<std::unique_ptr<Weight>> w = backend_->UploadWeight(host);
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? std::move(*w) : nullptr;
  }

  std::unique_ptr<CpuBackend> backend_;
  std::mt19937 rng_{20260401};
};

TEST_P(CpuBackendTest, UploadReportsTheWeightAsFp32) {
  const EncodedWeight e = Encode(WeightFormat::kMxfp4, 3, 64, rng_);
  std::unique_ptr<Weight> w = MustUpload(e.host());
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->rows(), 3);
  EXPECT_EQ(w->cols(), 64);
  EXPECT_EQ(w->format(), WeightFormat::kMxfp4);
  EXPECT_EQ(w->bytes(), 3 * 64 * 4);
}

// One thread (everything inline) and several (the pool splits loops).
INSTANTIATE_TEST_SUITE_P(Threads, CpuBackendTest, ::testing::Values(1, 3));

}  // namespace
}  // namespace mneme::gpu
