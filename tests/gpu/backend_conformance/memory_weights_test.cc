// Backend conformance: memory, UploadWeight and Linear on every backend of
// BackendFactories().

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gpu/backend.h"
#include "gtest/gtest.h"
#include "tests/gpu/backend_conformance/backend_factories.h"
#include "tests/gpu/backend_conformance/conformance_test_base.h"

namespace mneme::gpu::conformance {
namespace {

using MemoryWeightsTest = BackendConformanceTest;

TEST_P(MemoryWeightsTest, AllocateIsZeroFilledAndAligned) {
  for (int64_t n : {0, 1, 17, 1000}) {
    absl::StatusOr<std::unique_ptr<Buffer>> buffer = backend_->Allocate(n);
    ASSERT_TRUE(buffer.ok());
    EXPECT_EQ((*buffer)->size(), n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*buffer)->data()) % 64, 0u);
    // Backend memory may be a device's: read it through the backend.
    std::vector<float> host(n, 1.0f);
    backend_->CopyToHost((*buffer)->data(), absl::MakeSpan(host));
    EXPECT_EQ(host, std::vector<float>(n, 0.0f));
  }
  EXPECT_EQ(backend_->Allocate(int64_t{1} << 46).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_P(MemoryWeightsTest, CopiesRoundTrip) {
  const std::vector<float> values = Random(37);
  Mat m = Upload(values, 1, 37);
  EXPECT_EQ(Download(m), values);
  // Int32 lanes travel bit for bit (index lists share the buffers).
  const std::vector<int32_t> ints = {-7, 0, 1 << 30,
                                     std::numeric_limits<int32_t>::min() + 1};
  Mat k = Zeros(1, 4);
  backend_->CopyFromHost(
      absl::MakeConstSpan(reinterpret_cast<const float*>(ints.data()), 4),
      k.buffer->data());
  std::vector<int32_t> back(4);
  backend_->CopyToHost(
      k.buffer->data(),
      absl::MakeSpan(reinterpret_cast<float*>(back.data()), 4));
  EXPECT_EQ(back, ints);
}

// ---- UploadWeight
// ------------------------------------------------------------

TEST_P(MemoryWeightsTest, UploadRejectsBadShapesAndSizes) {
  const auto code = [&](const HostWeight& w) {
    return backend_->UploadWeight(w).status().code();
  };
  constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
  const EncodedWeight f32 = Encode(WeightFormat::kF32, 4, 8, rng_);
  const EncodedWeight bf16 = Encode(WeightFormat::kBf16, 4, 8, rng_);
  const EncodedWeight fp8 = Encode(WeightFormat::kFp8Block, 40, 70, rng_);
  const EncodedWeight mx = Encode(WeightFormat::kMxfp4, 4, 64, rng_);
  const EncodedWeight nv = Encode(WeightFormat::kNvfp4, 4, 32, rng_);
  for (const EncodedWeight* e : {&f32, &bf16, &fp8, &mx, &nv}) {
    EXPECT_TRUE(backend_->UploadWeight(e->host()).ok());
  }
  HostWeight w = f32.host();
  w.format = WeightFormat::kUnspecified;
  EXPECT_EQ(code(w), kInvalid);
  w.format = static_cast<WeightFormat>(99);
  EXPECT_EQ(code(w), kInvalid);
  // Shapes.
  w = f32.host();
  w.rows = 0;
  EXPECT_EQ(code(w), kInvalid);
  w = f32.host();
  w.cols = -8;
  EXPECT_EQ(code(w), kInvalid);
  // Data byte counts, each format.
  for (const EncodedWeight* e : {&f32, &bf16, &fp8, &mx, &nv}) {
    w = e->host();
    w.data = w.data.subspan(1);
    EXPECT_EQ(code(w), kInvalid) << static_cast<int>(e->format);
    w = e->host();
    w.rows += 1;
    EXPECT_EQ(code(w), kInvalid) << static_cast<int>(e->format);
  }
  // Scale byte counts.
  const std::vector<uint8_t> one_byte = {0x7F};
  w = f32.host();
  w.scale = one_byte;
  EXPECT_EQ(code(w), kInvalid);
  w = bf16.host();
  w.scale = one_byte;
  EXPECT_EQ(code(w), kInvalid);
  for (const EncodedWeight* e : {&fp8, &mx, &nv}) {
    w = e->host();
    w.scale = w.scale.subspan(1);
    EXPECT_EQ(code(w), kInvalid) << static_cast<int>(e->format);
  }
  // fp8 scales follow the block shape: 16 x 8 blocks need more scales.
  w = fp8.host();
  w.block_rows = 16;
  w.block_cols = 8;
  EXPECT_EQ(code(w), kInvalid);
  w.block_rows = 0;
  EXPECT_EQ(code(w), kInvalid);
  w.block_rows = 32;
  w.block_cols = -1;
  EXPECT_EQ(code(w), kInvalid);
  // Column multiples: 48 columns are not whole mxfp4 blocks, 24 not nvfp4.
  {
    std::vector<uint8_t> data(4 * 48 / 2), scale(4 * 48 / 32);
    w = mx.host();
    w.cols = 48;
    w.data = data;
    w.scale = scale;
    EXPECT_EQ(code(w), kInvalid);
    std::vector<uint8_t> nv_data(4 * 24 / 2), nv_scale(4 * 24 / 16);
    w = nv.host();
    w.cols = 24;
    w.data = nv_data;
    w.scale = nv_scale;
    EXPECT_EQ(code(w), kInvalid);
  }
  w = nv.host();
  w.global_scale = std::numeric_limits<float>::infinity();
  EXPECT_EQ(code(w), kInvalid);
}

TEST_P(MemoryWeightsTest, UploadReportsNansAsDataLoss) {
  const auto code = [&](const HostWeight& w) {
    return backend_->UploadWeight(w).status().code();
  };
  constexpr auto kDataLoss = absl::StatusCode::kDataLoss;
  EncodedWeight fp8 = Encode(WeightFormat::kFp8Block, 40, 70, rng_);
  fp8.scale[2] = 0xFF;  // UE8M0 NaN
  EXPECT_EQ(code(fp8.host()), kDataLoss);
  fp8.scale[2] = 0;  // 2^-127: valid
  EXPECT_TRUE(backend_->UploadWeight(fp8.host()).ok());
  fp8.data[5] = 0xFF;  // e4m3 NaN value
  EXPECT_EQ(code(fp8.host()), kDataLoss);
  fp8.data[5] = 0x7F;
  EXPECT_EQ(code(fp8.host()), kDataLoss);

  EncodedWeight mx = Encode(WeightFormat::kMxfp4, 4, 64, rng_);
  mx.scale.back() = 0xFF;
  EXPECT_EQ(code(mx.host()), kDataLoss);

  for (uint8_t nan : {uint8_t{0x7F}, uint8_t{0xFF}}) {
    EncodedWeight nv = Encode(WeightFormat::kNvfp4, 4, 32, rng_);
    nv.scale[1] = nan;
    EXPECT_EQ(code(nv.host()), kDataLoss);
  }
  EncodedWeight nv = Encode(WeightFormat::kNvfp4, 4, 32, rng_);
  nv.global_scale = std::nanf("");
  EXPECT_EQ(code(nv.host()), kDataLoss);

  EncodedWeight f32 = Encode(WeightFormat::kF32, 4, 8, rng_);
  const float nan_value = std::nanf("");
  std::memcpy(f32.data.data() + 12, &nan_value, 4);
  EXPECT_EQ(code(f32.host()), kDataLoss);

  EncodedWeight bf16 = Encode(WeightFormat::kBf16, 4, 8, rng_);
  bf16.data[6] = 0xC0;  // bits 0x7FC0
  bf16.data[7] = 0x7F;
  EXPECT_EQ(code(bf16.host()), kDataLoss);
}

// ---- Linear
// ------------------------------------------------------------------

struct LinearCase {
  WeightFormat format;
  int64_t tokens, rows, cols;
  int block_rows = 32, block_cols = 32;
};

TEST_P(MemoryWeightsTest, LinearMatchesReferenceForEveryFormat) {
  const LinearCase cases[] = {
      {WeightFormat::kF32, 1, 5, 7},
      {WeightFormat::kF32, 9, 33, 45},
      {WeightFormat::kBf16, 1, 17, 3},
      {WeightFormat::kBf16, 6, 40, 100},
      {WeightFormat::kFp8Block, 1, 45, 70},
      {WeightFormat::kFp8Block, 7, 64, 96},
      {WeightFormat::kFp8Block, 3, 19, 23, 3, 5},
      {WeightFormat::kFp8Block, 2, 37, 41, 16, 8},
      {WeightFormat::kMxfp4, 1, 9, 32},
      {WeightFormat::kMxfp4, 5, 31, 160},
      {WeightFormat::kNvfp4, 1, 11, 16},
      {WeightFormat::kNvfp4, 13, 20, 80},
      // More tokens than a decode batch (the CPU backend's prefill path).
      {WeightFormat::kBf16, 19, 40, 100},
      {WeightFormat::kFp8Block, 20, 37, 41, 16, 8},
      {WeightFormat::kMxfp4, 17, 9, 64},
      {WeightFormat::kNvfp4, 24, 20, 80},
      // The CUDA backend's row op over several chunks of 16 tokens (the
      // last one short) and exactly 16.
      {WeightFormat::kFp8Block, 33, 65, 41, 16, 8},
      {WeightFormat::kMxfp4, 40, 70, 96},
      {WeightFormat::kNvfp4, 16, 129, 80},
      // Its tiled Linear (from 64 tokens and 128 rows: tiles of 64 rows x
      // 32 tokens, 32 columns a step), ragged in all three directions, and
      // exactly four tiles.
      {WeightFormat::kF32, 64, 128, 32},
      {WeightFormat::kBf16, 70, 130, 100},
      {WeightFormat::kFp8Block, 96, 129, 41, 16, 8},
      {WeightFormat::kMxfp4, 65, 200, 96},
      {WeightFormat::kNvfp4, 100, 150, 80},
  };
  for (const LinearCase& c : cases) {
    SCOPED_TRACE(testing::Message()
                 << "format " << static_cast<int>(c.format) << " T " << c.tokens
                 << " " << c.rows << "x" << c.cols);
    const EncodedWeight e =
        Encode(c.format, c.rows, c.cols, rng_, c.block_rows, c.block_cols);
    std::unique_ptr<Weight> w = MustUpload(e.host());
    ASSERT_NE(w, nullptr);
    const std::vector<float> x = Random(c.tokens * c.cols);
    const std::vector<float> y0 = Random(c.tokens * c.rows);
    std::vector<double> ref(c.tokens * c.rows);
    double tolerance = 0;
    for (int64_t t = 0; t < c.tokens; ++t) {
      for (int64_t r = 0; r < c.rows; ++r) {
        double sum = 0, magnitude = 0;
        for (int64_t k = 0; k < c.cols; ++k) {
          sum += double{x[t * c.cols + k]} * e.values[r * c.cols + k];
          magnitude += std::fabs(x[t * c.cols + k] * e.values[r * c.cols + k]);
        }
        ref[t * c.rows + r] = sum;
        tolerance = std::max(tolerance, 1e-5 * magnitude);
      }
    }
    Mat xm = Upload(x, c.tokens, c.cols);
    // Without accumulate, whatever y held (NaN here) is overwritten.
    Mat ym = Upload(std::vector<float>(c.tokens * c.rows, std::nanf("")),
                    c.tokens, c.rows);
    backend_->Linear(xm.view, *w, ym.view);
    ExpectAllNear(Download(ym), ref, tolerance + 1e-6);
    // With accumulate.
    backend_->CopyFromHost(y0, ym.data());
    backend_->Linear(xm.view, *w, ym.view, Backend::Accumulate::kYes);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += y0[i];
    ExpectAllNear(Download(ym), ref, tolerance + 1e-6);
  }
}

TEST_P(MemoryWeightsTest, LinearDecodesNibblesAndScalesAsDocumented) {
  // mxfp4, 1 x 32: byte 0 = 0x21 holds element 0 = e2m1(1) = 0.5 in the low
  // nibble and element 1 = e2m1(2) = 1 in the high one; scale 2^1.
  std::vector<uint8_t> data(16, 0), scale = {128};
  data[0] = 0x21;
  data[15] = 0xF0;  // element 31 = e2m1(0xF) = -6
  HostWeight host;
  host.format = WeightFormat::kMxfp4;
  host.rows = 1;
  host.cols = 32;
  host.data = data;
  host.scale = scale;
  std::unique_ptr<Weight> w = MustUpload(host);
  ASSERT_NE(w, nullptr);
  Mat y = Zeros(1, 1);
  for (auto [col, expected] : {std::pair{0, 1.0f}, std::pair{1, 2.0f},
                               std::pair{2, 0.0f}, std::pair{31, -12.0f}}) {
    std::vector<float> x(32, 0.0f);
    x[col] = 1.0f;
    Mat xm = Upload(x, 1, 32);
    backend_->Linear(xm.view, *w, y.view);
    EXPECT_EQ(Download(y)[0], expected) << "column " << col;
  }
  // fp8: UE8M0 code 0 is 2^-127, not zero. e4m3 0x38 = 1.
  std::vector<uint8_t> fp8_data = {0x38}, fp8_scale = {0};
  host = HostWeight{};
  host.format = WeightFormat::kFp8Block;
  host.rows = 1;
  host.cols = 1;
  host.data = fp8_data;
  host.scale = fp8_scale;
  w = MustUpload(host);
  ASSERT_NE(w, nullptr);
  Mat xm = Upload({std::ldexp(1.0f, 120)}, 1, 1);
  backend_->Linear(xm.view, *w, y.view);
  EXPECT_EQ(Download(y)[0], std::ldexp(1.0f, -7));
}

INSTANTIATE_TEST_SUITE_P(Backends, MemoryWeightsTest,
                         ::testing::ValuesIn(BackendFactories()),
                         BackendFactoryName);

}  // namespace
}  // namespace mneme::gpu::conformance
