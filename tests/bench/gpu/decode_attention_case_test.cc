// The benchmark case's two ways of attending a decode step compute the same
// thing on the CPU backend (what the benchmarks check before timing them),
// and bad batch sizes are refused.

#include "tests/bench/gpu/decode_attention_case.h"

#include <memory>

#include "absl/status/statusor.h"
#include "gpu/cpu/cpu_backend.h"
#include "gtest/gtest.h"

namespace mneme::bench {
namespace {

TEST(DecodeAttentionCaseTest, GatheredAndInPlaceAgree) {
  absl::StatusOr<std::unique_ptr<gpu::CpuBackend>> backend =
      gpu::CpuBackend::Create(gpu::CpuBackendOptions{});
  ASSERT_TRUE(backend.ok()) << backend.status();
  for (const int sequences : {1, 3}) {
    absl::StatusOr<std::unique_ptr<DecodeAttentionCase>> c =
        DecodeAttentionCase::Create(**backend, sequences, 7);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE((*c)->Matches(1e-5f).ok()) << sequences;
  }
}

TEST(DecodeAttentionCaseTest, RefusesBatchesThePoolCannotHold) {
  absl::StatusOr<std::unique_ptr<gpu::CpuBackend>> backend =
      gpu::CpuBackend::Create(gpu::CpuBackendOptions{});
  ASSERT_TRUE(backend.ok()) << backend.status();
  for (const int sequences : {0, 52}) {
    EXPECT_EQ(
        DecodeAttentionCase::Create(**backend, sequences, 7).status().code(),
        absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace mneme::bench
