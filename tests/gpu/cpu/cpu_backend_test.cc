// What only the CPU backend promises beyond gpu/backend.h; the op cases
// every backend shares are the conformance suite
// (tests/gpu/backend_conformance).

#include "gpu/cpu/cpu_backend.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu/backend.h"
#include "gpu/host_weight.h"
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

// CpuBackend keeps weights in their checkpoint formats unless asked for fp32
// copies (cpu_backend.h).
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

TEST_P(CpuBackendTest, UploadHoldsTheCheckpointBytes) {
  struct Case {
    WeightFormat format;
    int64_t bytes;  // of a 64 x 96 weight, scales included
  };
  for (const Case& c : {Case{WeightFormat::kF32, int64_t{64} * 96 * 4},
                        Case{WeightFormat::kBf16, int64_t{64} * 96 * 2},
                        Case{WeightFormat::kFp8Block, 64 * 96 + 2 * 3},
                        Case{WeightFormat::kMxfp4, 64 * 48 + 64 * 3},
                        Case{WeightFormat::kNvfp4, 64 * 48 + 64 * 6}}) {
    SCOPED_TRACE(WeightFormatName(c.format));
    const EncodedWeight e = Encode(c.format, 64, 96, rng_);
    std::unique_ptr<Weight> w = MustUpload(e.host());
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->rows(), 64);
    EXPECT_EQ(w->cols(), 96);
    EXPECT_EQ(w->format(), c.format);
    EXPECT_EQ(w->bytes(), c.bytes);
    EXPECT_EQ(w->bytes(), static_cast<int64_t>(e.data.size() + e.scale.size()));
  }
}

TEST_P(CpuBackendTest, DequantizeWeightsHoldsFp32Copies) {
  absl::StatusOr<std::unique_ptr<CpuBackend>> fp32 = CpuBackend::Create(
      CpuBackendOptions{.threads = GetParam(), .dequantize_weights = true});
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  const EncodedWeight e = Encode(WeightFormat::kMxfp4, 3, 64, rng_);
  absl::StatusOr<std::unique_ptr<Weight>> w = (*fp32)->UploadWeight(e.host());
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->format(), WeightFormat::kMxfp4);
  EXPECT_EQ((*w)->bytes(), 3 * 64 * 4);
}

// The packed kernels against fp32 copies of the same weights in OpenBLAS:
// the same decoded values, so only the order of the fp32 sums differs. Every
// path: 1 to 16 tokens (decode: quant_kernels on the packed bytes), more
// (prefill: decoded panels, several when a panel holds fewer rows than the
// weight), accumulate. (The expert FFN and the hyper-connection mixes run the
// same Gemm; the conformance suite checks them against double references.)
TEST_P(CpuBackendTest, PackedWeightsMatchFp32Copies) {
  absl::StatusOr<std::unique_ptr<CpuBackend>> fp32 = CpuBackend::Create(
      CpuBackendOptions{.threads = GetParam(), .dequantize_weights = true});
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto random = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& f : v) f = u(rng_);
    return v;
  };
  // Runs Linear on both backends; returns {packed, fp32} results.
  auto linear = [&](const EncodedWeight& e, const std::vector<float>& x,
                    int64_t tokens, const std::vector<float>& y0,
                    Backend::Accumulate accumulate) {
    std::vector<std::vector<float>> out;
    for (Backend* backend : {static_cast<Backend*>(backend_.get()),
                             static_cast<Backend*>(fp32->get())}) {
      absl::StatusOr<std::unique_ptr<Weight>> w =
          backend->UploadWeight(e.host());
      EXPECT_TRUE(w.ok()) << w.status();
      if (!w.ok()) return out;
      absl::StatusOr<std::unique_ptr<Buffer>> xb =
          backend->Allocate(tokens * e.cols);
      absl::StatusOr<std::unique_ptr<Buffer>> yb =
          backend->Allocate(tokens * e.rows);
      EXPECT_TRUE(xb.ok() && yb.ok());
      if (!xb.ok() || !yb.ok()) return out;
      backend->CopyFromHost(x, (*xb)->data());
      backend->CopyFromHost(y0, (*yb)->data());
      backend->Linear(ConstMatrixView{(*xb)->data(), tokens, e.cols}, **w,
                      MatrixView{(*yb)->data(), tokens, e.rows}, accumulate);
      std::vector<float> y(static_cast<size_t>(tokens * e.rows));
      backend->CopyToHost((*yb)->data(), absl::MakeSpan(y));
      out.push_back(std::move(y));
    }
    return out;
  };
  struct Case {
    WeightFormat format;
    int64_t rows, cols;
    int block_rows = 32, block_cols = 32;
  };
  for (const Case& c : {Case{WeightFormat::kBf16, 70, 600},
                        Case{WeightFormat::kFp8Block, 70, 600, 128, 128},
                        Case{WeightFormat::kFp8Block, 41, 77, 5, 7},
                        Case{WeightFormat::kMxfp4, 70, 608},
                        Case{WeightFormat::kNvfp4, 70, 592},
                        // A panel (4 MiB) holds 512 rows of 2048 columns.
                        Case{WeightFormat::kNvfp4, 1100, 2048}}) {
    const EncodedWeight e =
        Encode(c.format, c.rows, c.cols, rng_, c.block_rows, c.block_cols);
    for (int64_t tokens : {1, 3, 16, 17, 40}) {
      if (c.rows > 1000 && tokens < 17) continue;
      SCOPED_TRACE(testing::Message()
                   << WeightFormatName(c.format) << " " << c.rows << " x "
                   << c.cols << ", " << tokens << " tokens");
      const std::vector<float> x = random(tokens * c.cols);
      const std::vector<float> y0 = random(tokens * c.rows);
      for (Backend::Accumulate accumulate :
           {Backend::Accumulate::kNo, Backend::Accumulate::kYes}) {
        const std::vector<std::vector<float>> y =
            linear(e, x, tokens, y0, accumulate);
        ASSERT_EQ(y.size(), 2u);
        for (int64_t t = 0; t < tokens; ++t) {
          for (int64_t r = 0; r < c.rows; ++r) {
            // Two fp32 sums of the same products in different orders: each
            // within cols unit roundoffs of the magnitude.
            double magnitude = 0;
            for (int64_t k = 0; k < c.cols; ++k) {
              magnitude += std::abs(double{x[t * c.cols + k]} *
                                    e.values[r * c.cols + k]);
            }
            const size_t i = static_cast<size_t>(t * c.rows + r);
            ASSERT_NEAR(y[0][i], y[1][i],
                        2.0 * (c.cols + 2) * 0x1p-24 * (magnitude + 1) + 1e-30)
                << "token " << t << " row " << r;
          }
        }
      }
    }
  }
}

TEST_P(CpuBackendTest, PackedEmbeddingRowsAreTheDequantizedRows) {
  const EncodedWeight e = Encode(WeightFormat::kBf16, 10, 48, rng_);
  std::unique_ptr<Weight> table = MustUpload(e.host());
  ASSERT_NE(table, nullptr);
  absl::StatusOr<std::unique_ptr<Buffer>> yb =
      backend_->Allocate(int64_t{4} * 48);
  ASSERT_TRUE(yb.ok());
  const std::vector<int32_t> ids = {103, 100, 109, 42};
  backend_->Embedding(ids, 100, *table, MatrixView{(*yb)->data(), 4, 48});
  std::vector<float> y(size_t{4} * 48);
  backend_->CopyToHost((*yb)->data(), absl::MakeSpan(y));
  for (int64_t t = 0; t < 4; ++t) {
    const int64_t row = ids[t] - 100;
    for (int64_t c = 0; c < 48; ++c) {
      const double expected =
          row >= 0 && row < 10 ? e.values[row * 48 + c] : 0.0;
      EXPECT_EQ(y[t * 48 + c], static_cast<float>(expected))
          << "token " << t << " col " << c;
    }
  }
}

// One thread (everything inline) and several (the pool splits loops).
INSTANTIATE_TEST_SUITE_P(Threads, CpuBackendTest, ::testing::Values(1, 3));

}  // namespace
}  // namespace mneme::gpu
