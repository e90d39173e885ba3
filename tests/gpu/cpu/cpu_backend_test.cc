#include "gpu/cpu/cpu_backend.h"

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
#include "formats/bf16.h"
#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "formats/ue8m0.h"
#include "gpu/backend.h"
#include "gtest/gtest.h"

namespace mneme::gpu {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- independent decoders of the narrow formats (the reference side) ------

double RefE4m3(uint8_t code) {
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  const int exponent = (code >> 3) & 0xF;
  const int mantissa = code & 0x7;
  if (exponent == 0) return sign * std::ldexp(mantissa, -9);
  return sign * std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
}

double RefUe8m0(uint8_t code) { return std::ldexp(1.0, int{code} - 127); }

double RefE2m1(uint8_t nibble) {
  static constexpr double kMagnitude[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (nibble & 0x8 ? -1.0 : 1.0) * kMagnitude[nibble & 0x7];
}

double RefSigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// A checkpoint weight's bytes and the values they stand for.
struct EncodedWeight {
  WeightFormat format = WeightFormat::kUnspecified;
  int64_t rows = 0;
  int64_t cols = 0;
  int block_rows = 32;
  int block_cols = 32;
  float global_scale = 1.0f;
  std::vector<uint8_t> data;
  std::vector<uint8_t> scale;
  std::vector<double> values;  // rows x cols, decoded independently

  HostWeight host() const {
    HostWeight w;
    w.format = format;
    w.rows = rows;
    w.cols = cols;
    w.data = data;
    w.scale = scale;
    w.block_rows = block_rows;
    w.block_cols = block_cols;
    w.global_scale = global_scale;
    return w;
  }
};

// Random values of a [rows, cols] weight in `format`, encoded with the
// project's encoders and decoded back with the reference decoders above.
EncodedWeight Encode(WeightFormat format, int64_t rows, int64_t cols,
                     std::mt19937& rng, int block_rows = 32,
                     int block_cols = 32) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(rows * cols);
  for (float& x : v) x = normal(rng);
  EncodedWeight w;
  w.format = format;
  w.rows = rows;
  w.cols = cols;
  w.block_rows = block_rows;
  w.block_cols = block_cols;
  w.values.resize(v.size());
  switch (format) {
    case WeightFormat::kF32:
      w.data.resize(v.size() * 4);
      std::memcpy(w.data.data(), v.data(), w.data.size());
      for (size_t i = 0; i < v.size(); ++i) w.values[i] = v[i];
      break;
    case WeightFormat::kBf16:
      for (size_t i = 0; i < v.size(); ++i) {
        const uint16_t bits = formats::FloatToBf16(v[i]);
        w.data.push_back(static_cast<uint8_t>(bits & 0xFF));
        w.data.push_back(static_cast<uint8_t>(bits >> 8));
        uint32_t wide = uint32_t{bits} << 16;
        float f;
        std::memcpy(&f, &wide, 4);
        w.values[i] = f;
      }
      break;
    case WeightFormat::kFp8Block: {
      const int64_t scale_rows = (rows + block_rows - 1) / block_rows;
      const int64_t scale_cols = (cols + block_cols - 1) / block_cols;
      w.scale.resize(scale_rows * scale_cols);
      for (int64_t br = 0; br < scale_rows; ++br) {
        for (int64_t bc = 0; bc < scale_cols; ++bc) {
          float amax = 0.0f;
          for (int64_t r = br * block_rows;
               r < std::min(rows, (br + 1) * block_rows); ++r) {
            for (int64_t c = bc * block_cols;
                 c < std::min(cols, (bc + 1) * block_cols); ++c) {
              amax = std::max(amax, std::fabs(v[r * cols + c]));
            }
          }
          w.scale[br * scale_cols + bc] =
              formats::FloatToUe8m0(amax / formats::kE4m3Max);
        }
      }
      w.data.resize(v.size());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const uint8_t s =
              w.scale[(r / block_rows) * scale_cols + c / block_cols];
          const uint8_t code =
              formats::FloatToE4m3(v[r * cols + c] / formats::Ue8m0ToFloat(s));
          w.data[r * cols + c] = code;
          w.values[r * cols + c] = RefE4m3(code) * RefUe8m0(s);
        }
      }
      break;
    }
    case WeightFormat::kMxfp4:
    case WeightFormat::kNvfp4: {
      const bool mx = format == WeightFormat::kMxfp4;
      const int64_t block = mx ? 32 : 16;
      if (!mx) w.global_scale = 0.0123f;
      w.data.assign(v.size() / 2, 0);
      w.scale.resize(v.size() / block);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < cols / block; ++b) {
          float amax = 0.0f;
          for (int64_t c = b * block; c < (b + 1) * block; ++c) {
            amax = std::max(amax, std::fabs(v[r * cols + c]));
          }
          const int64_t si = r * (cols / block) + b;
          double scale;
          if (mx) {
            w.scale[si] = formats::FloatToUe8m0(amax / formats::kE2m1Max);
            scale = RefUe8m0(w.scale[si]);
          } else {
            w.scale[si] =
                formats::FloatToE4m3(amax / formats::kE2m1Max / w.global_scale);
            scale = RefE4m3(w.scale[si]) * w.global_scale;
          }
          for (int64_t c = b * block; c < (b + 1) * block; ++c) {
            const int64_t i = r * cols + c;
            const uint8_t code = formats::FloatToE2m1(
                static_cast<float>(v[i] / (scale == 0 ? 1.0 : scale)));
            w.data[i / 2] |= (i % 2 == 0) ? code : code << 4;
            w.values[i] = RefE2m1(code) * scale;
          }
        }
      }
      break;
    }
    case WeightFormat::kUnspecified:
      break;
  }
  return w;
}

// A backend matrix with its buffer.
struct Mat {
  std::unique_ptr<Buffer> buffer;
  MatrixView view;
  float* data() { return view.data; }
};

class CpuBackendTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<CpuBackend>> backend =
        CpuBackend::Create(CpuBackendOptions{.threads = GetParam()});
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
  }

  Mat Zeros(int64_t rows, int64_t cols) {
    absl::StatusOr<std::unique_ptr<Buffer>> buffer =
        backend_->Allocate(rows * cols);
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    Mat m{std::move(*buffer), {}};
    m.view = m.buffer->view(rows, cols);
    return m;
  }

  Mat Upload(const std::vector<float>& values, int64_t rows, int64_t cols) {
    EXPECT_EQ(static_cast<int64_t>(values.size()), rows * cols);
    Mat m = Zeros(rows, cols);
    backend_->CopyFromHost(values, m.data());
    return m;
  }

  std::vector<float> Download(const Mat& m) {
    std::vector<float> out(m.view.rows * m.view.cols);
    backend_->CopyToHost(m.view.data, absl::MakeSpan(out));
    return out;
  }

  std::vector<float> Random(int64_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = u(rng_);
    return v;
  }

  std::unique_ptr<Weight> MustUpload(const HostWeight& host) {
    absl::StatusOr<std::unique_ptr<Weight>> w = backend_->UploadWeight(host);
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? std::move(*w) : nullptr;
  }

  std::unique_ptr<Weight> F32Weight(const std::vector<float>& values,
                                    int64_t rows, int64_t cols) {
    HostWeight host;
    host.format = WeightFormat::kF32;
    host.rows = rows;
    host.cols = cols;
    host.data = absl::MakeConstSpan(
        reinterpret_cast<const uint8_t*>(values.data()), values.size() * 4);
    return MustUpload(host);
  }

  std::unique_ptr<CpuBackend> backend_;
  std::mt19937 rng_{20260401};
};

// Expects |actual - expected| <= tolerance elementwise.
void ExpectAllNear(const std::vector<float>& actual,
                   const std::vector<double>& expected, double tolerance) {
  ASSERT_EQ(actual.size(), expected.size());
  int failures = 0;
  for (size_t i = 0; i < actual.size() && failures < 5; ++i) {
    if (!(std::fabs(actual[i] - expected[i]) <= tolerance)) {
      ADD_FAILURE() << "element " << i << ": " << actual[i] << " vs "
                    << expected[i];
      ++failures;
    }
  }
}

// ---- creation and memory ---------------------------------------------------

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

TEST_P(CpuBackendTest, AllocateIsZeroFilledAndAligned) {
  for (int64_t n : {0, 1, 17, 1000}) {
    absl::StatusOr<std::unique_ptr<Buffer>> buffer = backend_->Allocate(n);
    ASSERT_TRUE(buffer.ok());
    EXPECT_EQ((*buffer)->size(), n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*buffer)->data()) % 64, 0u);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ((*buffer)->data()[i], 0.0f);
  }
  EXPECT_EQ(backend_->Allocate(int64_t{1} << 46).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_P(CpuBackendTest, CopiesRoundTrip) {
  const std::vector<float> values = Random(37);
  Mat m = Upload(values, 1, 37);
  EXPECT_EQ(Download(m), values);
  m.buffer->ints()[3] = -7;
  EXPECT_EQ(m.buffer->ints()[3], -7);
}

// ---- UploadWeight
// ------------------------------------------------------------

TEST_P(CpuBackendTest, UploadReportsTheWeightAsFp32) {
  const EncodedWeight e = Encode(WeightFormat::kMxfp4, 3, 64, rng_);
  std::unique_ptr<Weight> w = MustUpload(e.host());
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->rows(), 3);
  EXPECT_EQ(w->cols(), 64);
  EXPECT_EQ(w->format(), WeightFormat::kMxfp4);
  EXPECT_EQ(w->bytes(), 3 * 64 * 4);
}

TEST_P(CpuBackendTest, UploadRejectsBadShapesAndSizes) {
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

TEST_P(CpuBackendTest, UploadReportsNansAsDataLoss) {
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

TEST_P(CpuBackendTest, LinearMatchesReferenceForEveryFormat) {
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

TEST_P(CpuBackendTest, LinearDecodesNibblesAndScalesAsDocumented) {
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

// ---- RmsNorm, Rope, copies
// ---------------------------------------------------

TEST_P(CpuBackendTest, RmsNormMatchesReference) {
  const float eps = 1e-6f;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1},
                            {1, 7},
                            {3, 64},
                            {17, 1000},
                            {5, 33}}) {
    for (bool with_weight : {false, true}) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(testing::Message()
                     << rows << "x" << cols << " weight " << with_weight
                     << " alias " << in_place);
        const std::vector<float> x = Random(rows * cols, -3, 3);
        const std::vector<float> weight = Random(cols);
        std::vector<double> ref(rows * cols);
        for (int64_t r = 0; r < rows; ++r) {
          double ss = 0;
          for (int64_t c = 0; c < cols; ++c) {
            ss += double{x[r * cols + c]} * x[r * cols + c];
          }
          const double inv = 1.0 / std::sqrt(ss / cols + eps);
          for (int64_t c = 0; c < cols; ++c) {
            ref[r * cols + c] =
                x[r * cols + c] * inv * (with_weight ? weight[c] : 1.0);
          }
        }
        Mat xm = Upload(x, rows, cols);
        Mat wm = Upload(weight, 1, cols);
        Mat ym = in_place ? Mat{nullptr, xm.view} : Zeros(rows, cols);
        backend_->RmsNorm(xm.view, with_weight ? wm.data() : nullptr, eps,
                          ym.view);
        ExpectAllNear(in_place ? Download(xm) : Download(ym), ref, 1e-5);
      }
    }
  }
}

TEST_P(CpuBackendTest, RopeMatchesReferenceAndInverts) {
  struct Case {
    int64_t tokens;
    int heads, head_dim, rope_dim;
  };
  for (const Case& c : {Case{1, 1, 8, 8}, Case{5, 3, 10, 4}, Case{4, 8, 64, 16},
                        Case{2, 2, 6, 0}}) {
    SCOPED_TRACE(testing::Message() << c.tokens << " " << c.heads << " "
                                    << c.head_dim << " " << c.rope_dim);
    const float theta = 10000.0f;
    const int64_t cols = c.heads * c.head_dim;
    const std::vector<float> x = Random(c.tokens * cols);
    std::vector<int32_t> positions(c.tokens);
    std::uniform_int_distribution<int32_t> pos(0, 100000);
    for (int32_t& p : positions) p = pos(rng_);
    positions[0] = 0;
    std::vector<double> ref(x.begin(), x.end());
    for (int64_t t = 0; t < c.tokens; ++t) {
      for (int h = 0; h < c.heads; ++h) {
        for (int i = 0; i < c.rope_dim / 2; ++i) {
          const double angle =
              positions[t] * std::pow(double{theta}, -2.0 * i / c.rope_dim);
          const int64_t at =
              t * cols + h * c.head_dim + c.head_dim - c.rope_dim + 2 * i;
          const double a = x[at], b = x[at + 1];
          ref[at] = a * std::cos(angle) - b * std::sin(angle);
          ref[at + 1] = a * std::sin(angle) + b * std::cos(angle);
        }
      }
    }
    Mat xm = Upload(x, c.tokens, cols);
    backend_->Rope(xm.view, c.head_dim, c.rope_dim, theta, positions,
                   Backend::RopeDirection::kForward);
    ExpectAllNear(Download(xm), ref, 1e-5);
    backend_->Rope(xm.view, c.head_dim, c.rope_dim, theta, positions,
                   Backend::RopeDirection::kInverse);
    ExpectAllNear(Download(xm), std::vector<double>(x.begin(), x.end()), 1e-5);
  }
}

TEST_P(CpuBackendTest, AddAndRowCopies) {
  const std::vector<float> a = Random(5 * 9), b = Random(5 * 9);
  Mat am = Upload(a, 5, 9), bm = Upload(b, 5, 9), ym = Zeros(5, 9);
  backend_->Add(am.view, bm.view, ym.view);
  std::vector<double> sum(a.size());
  for (size_t i = 0; i < a.size(); ++i) sum[i] = double{a[i]} + b[i];
  ExpectAllNear(Download(ym), sum, 1e-6);
  backend_->Add(am.view, bm.view, am.view);  // y aliases a
  ExpectAllNear(Download(am), sum, 1e-6);

  // Columns [2, 6) of b.
  Mat cols = Zeros(5, 4);
  backend_->CopyColumns(bm.view, 2, cols.view);
  const std::vector<float> got = Download(cols);
  for (int r = 0; r < 5; ++r) {
    for (int c = 0; c < 4; ++c) EXPECT_EQ(got[r * 4 + c], b[r * 9 + 2 + c]);
  }

  const std::vector<int32_t> rows = {4, 0, 4};
  Mat gathered = Zeros(3, 9);
  backend_->GatherRows(bm.view, rows, gathered.view);
  const std::vector<float> g = Download(gathered);
  for (int i = 0; i < 3; ++i) {
    for (int c = 0; c < 9; ++c) EXPECT_EQ(g[i * 9 + c], b[rows[i] * 9 + c]);
  }
  const std::vector<float> src = Random(2 * 9);
  Mat srcm = Upload(src, 2, 9);
  Mat target = Upload(b, 5, 9);
  const std::vector<int32_t> to = {3, 1};
  backend_->ScatterRows(srcm.view, to, target.view);
  std::vector<float> expected = b;
  std::copy_n(src.begin(), 9, expected.begin() + 3 * 9);
  std::copy_n(src.begin() + 9, 9, expected.begin() + 1 * 9);
  EXPECT_EQ(Download(target), expected);
}

TEST_P(CpuBackendTest, EmbeddingZerosIdsOutsideTheShard) {
  for (WeightFormat format : {WeightFormat::kBf16, WeightFormat::kF32}) {
    const EncodedWeight e = Encode(format, 5, 12, rng_);
    std::unique_ptr<Weight> table = MustUpload(e.host());
    ASSERT_NE(table, nullptr);
    const std::vector<int32_t> ids = {10, 14, 9, 15, -3, 12};
    Mat y = Upload(std::vector<float>(6 * 12, 7.0f), 6, 12);
    backend_->Embedding(ids, /*first_id=*/10, *table, y.view);
    const std::vector<float> got = Download(y);
    for (size_t t = 0; t < ids.size(); ++t) {
      const int64_t row = ids[t] - 10;
      for (int c = 0; c < 12; ++c) {
        const double expected =
            row >= 0 && row < 5 ? e.values[row * 12 + c] : 0.0;
        EXPECT_EQ(got[t * 12 + c], expected) << "token " << t;
      }
    }
  }
}

// ---- attention
// -----------------------------------------------------------------

// Double-precision attention for one (token, head): out and lse.
void RefAttention(const std::vector<float>& q, const std::vector<float>& kv,
                  int64_t hd, int heads, const std::vector<KeyRanges>& ranges,
                  double scale, const std::vector<float>* sink,
                  std::vector<double>* out, std::vector<double>* lse) {
  const int64_t tokens = ranges.size();
  out->assign(tokens * heads * hd, 0.0);
  lse->assign(tokens * heads, -kInf);
  for (int64_t t = 0; t < tokens; ++t) {
    std::set<int32_t> keys;
    for (int i = 0; i < 2; ++i) {
      for (int32_t j = ranges[t].begin[i]; j < ranges[t].end[i]; ++j) {
        keys.insert(j);
      }
    }
    if (keys.empty()) continue;
    for (int h = 0; h < heads; ++h) {
      std::vector<double> s;
      for (int32_t j : keys) {
        double dot = 0;
        for (int64_t i = 0; i < hd; ++i) {
          dot += double{q[t * heads * hd + h * hd + i]} * kv[j * hd + i];
        }
        s.push_back(scale * dot);
      }
      const double max = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double v : s) sum += std::exp(v - max);
      const double l = max + std::log(sum);
      (*lse)[t * heads + h] = l;
      const double gate = sink ? RefSigmoid(l - (*sink)[h]) : 1.0;
      size_t n = 0;
      for (int32_t j : keys) {
        const double p = std::exp(s[n++] - l);
        for (int64_t i = 0; i < hd; ++i) {
          (*out)[t * heads * hd + h * hd + i] += gate * p * kv[j * hd + i];
        }
      }
    }
  }
}

TEST_P(CpuBackendTest, AttentionMatchesReference) {
  struct Case {
    int64_t tokens;
    int heads;
    int64_t hd, keys;
  };
  for (const Case& c :
       {Case{1, 1, 7, 1}, Case{1, 8, 64, 300}, Case{4, 3, 7, 40},
        Case{9, 2, 33, 260}, Case{3, 4, 16, 0}}) {
    SCOPED_TRACE(testing::Message()
                 << c.tokens << " " << c.heads << " " << c.hd << " " << c.keys);
    const std::vector<float> q = Random(c.tokens * c.heads * c.hd, -2, 2);
    const std::vector<float> kv = Random(c.keys * c.hd, -2, 2);
    std::vector<KeyRanges> ranges(c.tokens);
    std::uniform_int_distribution<int32_t> key(0, static_cast<int32_t>(c.keys));
    for (int64_t t = 0; t < c.tokens; ++t) {
      for (int i = 0; i < 2; ++i) {
        int32_t a = key(rng_), b = key(rng_);
        if (a > b) std::swap(a, b);
        ranges[t].begin[i] = a;
        ranges[t].end[i] = b;
      }
    }
    if (c.tokens > 1 && c.keys > 10) {
      // KeyRanges{{begin0, begin1}, {end0, end1}}.
      ranges[0] = KeyRanges{{0, 0}, {0, 0}};      // nothing visible
      ranges[1] = KeyRanges{{2, 4}, {5, 10}};     // [2, 5) and [4, 10) overlap
      ranges.back() = KeyRanges{{0, 3}, {7, 3}};  // [0, 7), the second empty
    }
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.hd));
    const std::vector<float> sink = Random(c.heads, -1, 3);
    Mat qm = Upload(q, c.tokens, c.heads * c.hd);
    Mat kvm = Upload(kv, c.keys, c.hd);
    Mat sinkm = Upload(sink, 1, c.heads);
    Mat out = Zeros(c.tokens, c.heads * c.hd), lse = Zeros(c.tokens, c.heads);
    std::vector<double> ref_out, ref_lse;

    RefAttention(q, kv, c.hd, c.heads, ranges, scale, nullptr, &ref_out,
                 &ref_lse);
    backend_->Attention(qm.view, kvm.view, c.heads, ranges,
                        static_cast<float>(scale), nullptr, out.view, lse.view);
    ExpectAllNear(Download(out), ref_out, 1e-5);
    const std::vector<float> got_lse = Download(lse);
    for (size_t i = 0; i < ref_lse.size(); ++i) {
      if (std::isinf(ref_lse[i])) {
        EXPECT_EQ(got_lse[i], -std::numeric_limits<float>::infinity());
      } else {
        EXPECT_NEAR(got_lse[i], ref_lse[i], 1e-5);
      }
    }
    const std::vector<float> no_sink_out = Download(out);

    // With the sink: the reference, the same lse, and the same as applying it
    // afterwards.
    RefAttention(q, kv, c.hd, c.heads, ranges, scale, &sink, &ref_out,
                 &ref_lse);
    backend_->Attention(qm.view, kvm.view, c.heads, ranges,
                        static_cast<float>(scale), sinkm.data(), out.view,
                        lse.view);
    ExpectAllNear(Download(out), ref_out, 1e-5);
    EXPECT_EQ(Download(lse), got_lse);
    Mat applied = Upload(no_sink_out, c.tokens, c.heads * c.hd);
    backend_->ApplySink(lse.view, sinkm.data(), applied.view);
    EXPECT_EQ(Download(applied), Download(out));
  }
}

TEST_P(CpuBackendTest, AttentionWithNoVisibleKeyGivesZerosAndMinusInf) {
  const std::vector<KeyRanges> ranges = {KeyRanges{{3, 0}, {3, 0}},
                                         KeyRanges{}};
  Mat q = Upload(Random(2 * 2 * 8), 2, 16);
  Mat kv = Upload(Random(6 * 8), 6, 8);
  Mat sink = Upload({0.5f, -0.5f}, 1, 2);
  for (const float* s : {static_cast<const float*>(nullptr),
                         static_cast<const float*>(sink.data())}) {
    Mat out = Upload(std::vector<float>(2 * 16, 9.0f), 2, 16);
    Mat lse = Zeros(2, 2);
    backend_->Attention(q.view, kv.view, 2, ranges, 0.3f, s, out.view,
                        lse.view);
    EXPECT_EQ(Download(out), std::vector<float>(2 * 16, 0.0f));
    EXPECT_EQ(Download(lse),
              std::vector<float>(4, -std::numeric_limits<float>::infinity()));
  }
}

TEST_P(CpuBackendTest, SoftmaxPoolMatchesReference) {
  for (auto [r, d] : {std::pair<int64_t, int64_t>{1, 1}, {4, 9}, {7, 64}}) {
    const std::vector<float> kv = Random(r * d), score = Random(r * d, -4, 4),
                             ape = Random(r * d);
    std::vector<double> ref(d);
    for (int64_t c = 0; c < d; ++c) {
      double max = -kInf;
      for (int64_t i = 0; i < r; ++i) {
        max = std::max(max, double{score[i * d + c]} + ape[i * d + c]);
      }
      double num = 0, den = 0;
      for (int64_t i = 0; i < r; ++i) {
        const double e =
            std::exp(double{score[i * d + c]} + ape[i * d + c] - max);
        den += e;
        num += e * kv[i * d + c];
      }
      ref[c] = num / den;
    }
    Mat kvm = Upload(kv, r, d), sm = Upload(score, r, d),
        am = Upload(ape, r, d);
    Mat out = Zeros(1, d);
    backend_->SoftmaxPool(kvm.view, sm.view, am.view, out.view);
    ExpectAllNear(Download(out), ref, 1e-6);
  }
}

// ---- hyper-connections
// ---------------------------------------------------------

TEST_P(CpuBackendTest, HcPreMatchesReferenceAndSinkhornNormalises) {
  const float eps = 1e-6f;
  for (int hc : {1, 4}) {
    for (int64_t d : {8, 33}) {
      for (int64_t tokens : {1, 3}) {
        for (int iters : {0, 1, 20}) {
          SCOPED_TRACE(testing::Message() << "hc " << hc << " D " << d << " T "
                                          << tokens << " iters " << iters);
          const int64_t width = hc * d;
          const int64_t num_mix = (2 + hc) * hc;
          const std::vector<float> xs = Random(tokens * width, -2, 2);
          const std::vector<float> fn = Random(num_mix * width, -0.2f, 0.2f);
          const std::vector<float> base = Random(num_mix);
          const std::vector<float> scale = Random(3, 0.5f, 1.5f);
          std::vector<double> ref_x(tokens * d, 0.0), ref_post(tokens * hc),
              ref_comb(tokens * hc * hc);
          for (int64_t t = 0; t < tokens; ++t) {
            double ss = 0;
            for (int64_t i = 0; i < width; ++i) {
              ss += double{xs[t * width + i]} * xs[t * width + i];
            }
            const double norm = 1.0 / std::sqrt(ss / width + eps);
            std::vector<double> mix(num_mix);
            for (int64_t m = 0; m < num_mix; ++m) {
              double dot = 0;
              for (int64_t i = 0; i < width; ++i) {
                dot += double{xs[t * width + i]} * fn[m * width + i];
              }
              mix[m] = dot * norm;
            }
            for (int h = 0; h < hc; ++h) {
              const double pre = RefSigmoid(mix[h] * scale[0] + base[h]) + eps;
              for (int64_t i = 0; i < d; ++i) {
                ref_x[t * d + i] += pre * xs[t * width + h * d + i];
              }
              ref_post[t * hc + h] =
                  2 * RefSigmoid(mix[hc + h] * scale[1] + base[hc + h]);
            }
            double* comb = &ref_comb[t * hc * hc];
            for (int i = 0; i < hc * hc; ++i) {
              comb[i] = std::exp(mix[2 * hc + i] * scale[2] + base[2 * hc + i]);
            }
            for (int it = 0; it < iters; ++it) {
              for (int i = 0; i < hc; ++i) {
                double s = 0;
                for (int j = 0; j < hc; ++j) s += comb[i * hc + j];
                for (int j = 0; j < hc; ++j) comb[i * hc + j] /= s;
              }
              for (int j = 0; j < hc; ++j) {
                double s = 0;
                for (int i = 0; i < hc; ++i) s += comb[i * hc + j];
                for (int i = 0; i < hc; ++i) comb[i * hc + j] /= s;
              }
            }
          }
          std::unique_ptr<Weight> fnw = F32Weight(fn, num_mix, width);
          Mat xsm = Upload(xs, tokens, width);
          Mat basem = Upload(base, 1, num_mix), scalem = Upload(scale, 1, 3);
          Mat x = Zeros(tokens, d), post = Zeros(tokens, hc),
              comb = Zeros(tokens, hc * hc);
          backend_->HcPre(xsm.view, *fnw, basem.data(), scalem.data(), hc,
                          iters, eps, x.view, post.view, comb.view);
          ExpectAllNear(Download(x), ref_x, 1e-5);
          ExpectAllNear(Download(post), ref_post, 1e-5);
          std::vector<double> rel_comb = ref_comb;
          const std::vector<float> got_comb = Download(comb);
          for (size_t i = 0; i < rel_comb.size(); ++i) {
            EXPECT_NEAR(got_comb[i], rel_comb[i], 1e-5 * (1 + rel_comb[i]));
          }
          if (iters == 20) {
            for (int64_t t = 0; t < tokens; ++t) {
              for (int i = 0; i < hc; ++i) {
                double row = 0, col = 0;
                for (int j = 0; j < hc; ++j) {
                  row += got_comb[t * hc * hc + i * hc + j];
                  col += got_comb[t * hc * hc + j * hc + i];
                }
                EXPECT_NEAR(row, 1.0, 1e-3);
                EXPECT_NEAR(col, 1.0, 1e-5);
              }
            }
          }
        }
      }
    }
  }
}

TEST_P(CpuBackendTest, HcPostMatchesReference) {
  for (int hc : {1, 4}) {
    for (int64_t tokens : {1, 5}) {
      const int64_t d = 19, width = hc * d;
      const std::vector<float> a = Random(tokens * d),
                               post = Random(tokens * hc),
                               comb = Random(tokens * hc * hc),
                               xs = Random(tokens * width);
      std::vector<double> ref(tokens * width);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int j = 0; j < hc; ++j) {
          for (int64_t i = 0; i < d; ++i) {
            double v = double{post[t * hc + j]} * a[t * d + i];
            for (int src = 0; src < hc; ++src) {
              v += double{comb[t * hc * hc + src * hc + j]} *
                   xs[t * width + src * d + i];
            }
            ref[t * width + j * d + i] = v;
          }
        }
      }
      Mat am = Upload(a, tokens, d), pm = Upload(post, tokens, hc),
          cm = Upload(comb, tokens, hc * hc), xm = Upload(xs, tokens, width);
      backend_->HcPost(am.view, pm.view, cm.view, hc, xm.view);
      ExpectAllNear(Download(xm), ref, 1e-5);
    }
  }
}

TEST_P(CpuBackendTest, HcHeadMatchesReference) {
  const float eps = 1e-6f;
  for (int hc : {1, 4}) {
    for (int64_t tokens : {1, 6}) {
      const int64_t d = 21, width = hc * d;
      const std::vector<float> xs = Random(tokens * width, -2, 2),
                               fn = Random(hc * width, -0.2f, 0.2f),
                               base = Random(hc), scale = Random(1, 0.5f, 2.0f);
      std::vector<double> ref(tokens * d, 0.0);
      for (int64_t t = 0; t < tokens; ++t) {
        double ss = 0;
        for (int64_t i = 0; i < width; ++i) {
          ss += double{xs[t * width + i]} * xs[t * width + i];
        }
        const double norm = 1.0 / std::sqrt(ss / width + eps);
        for (int h = 0; h < hc; ++h) {
          double dot = 0;
          for (int64_t i = 0; i < width; ++i) {
            dot += double{xs[t * width + i]} * fn[h * width + i];
          }
          const double w = RefSigmoid(dot * norm * scale[0] + base[h]) + eps;
          for (int64_t i = 0; i < d; ++i) {
            ref[t * d + i] += w * xs[t * width + h * d + i];
          }
        }
      }
      std::unique_ptr<Weight> fnw = F32Weight(fn, hc, width);
      Mat xsm = Upload(xs, tokens, width), bm = Upload(base, 1, hc),
          sm = Upload(scale, 1, 1), x = Zeros(tokens, d);
      backend_->HcHead(xsm.view, *fnw, bm.data(), sm.data(), hc, eps, x.view);
      ExpectAllNear(Download(x), ref, 1e-5);
    }
  }
}

// ---- Engram gate
// ---------------------------------------------------------------

// The gate each copy of token 0 received: (new - old) / value.
std::vector<double> GatesOf(const std::vector<float>& before,
                            const std::vector<float>& after,
                            const std::vector<float>& kv, int hc, int64_t d) {
  std::vector<double> gates(hc);
  for (int h = 0; h < hc; ++h) {
    gates[h] = (double{after[h * d]} - before[h * d]) / kv[hc * d];
  }
  return gates;
}

TEST_P(CpuBackendTest, EngramGateMatchesReference) {
  const float eps = 1e-6f;
  for (int hc : {1, 4}) {
    for (int64_t d : {16, 33}) {
      const int64_t tokens = 3, width = hc * d;
      const std::vector<float> xs = Random(tokens * width),
                               kv = Random(tokens * (hc + 1) * d),
                               q_w = Random(hc * d, 0.5f, 1.5f),
                               k_w = Random(hc * d, 0.5f, 1.5f);
      std::vector<double> ref(xs.begin(), xs.end());
      for (int64_t t = 0; t < tokens; ++t) {
        for (int h = 0; h < hc; ++h) {
          double dot = 0, xx = 0, kk = 0;
          for (int64_t i = 0; i < d; ++i) {
            const double x = xs[t * width + h * d + i];
            const double key = kv[t * (hc + 1) * d + h * d + i];
            dot += x * q_w[h * d + i] * k_w[h * d + i] * key;
            xx += x * x;
            kk += key * key;
          }
          dot *= 1.0 / std::sqrt(xx / d + eps) / std::sqrt(kk / d + eps) /
                 std::sqrt(static_cast<double>(d));
          const double root = std::sqrt(std::max(std::fabs(dot), 1e-6));
          const double gate = RefSigmoid(dot > 0 ? root : dot < 0 ? -root : 0);
          for (int64_t i = 0; i < d; ++i) {
            ref[t * width + h * d + i] +=
                gate * kv[t * (hc + 1) * d + hc * d + i];
          }
        }
      }
      Mat kvm = Upload(kv, tokens, (hc + 1) * d), qm = Upload(q_w, hc, d),
          km = Upload(k_w, hc, d), xm = Upload(xs, tokens, width);
      backend_->EngramGate(kvm.view, qm.data(), km.data(), hc, eps, xm.view);
      ExpectAllNear(Download(xm), ref, 1e-5);
    }
  }
}

TEST_P(CpuBackendTest, EngramGateFollowsTheSignOfTheDot) {
  // Copy 0's key is its x (dot > 0), copy 1's key is -x (dot < 0).
  const int hc = 2;
  const int64_t d = 16;
  const std::vector<float> x = Random(d, 0.1f, 1.0f);
  std::vector<float> xs(hc * d), kv((hc + 1) * d);
  for (int64_t i = 0; i < d; ++i) {
    xs[i] = xs[d + i] = x[i];
    kv[i] = x[i];
    kv[d + i] = -x[i];
    kv[2 * d + i] = 1.0f;  // the value
  }
  const auto gates = [&](float q_value) {
    Mat kvm = Upload(kv, 1, (hc + 1) * d), xm = Upload(xs, 1, hc * d);
    Mat qm = Upload(std::vector<float>(hc * d, q_value), hc, d);
    Mat km = Upload(std::vector<float>(hc * d, 1.0f), hc, d);
    backend_->EngramGate(kvm.view, qm.data(), km.data(), hc, 1e-6f, xm.view);
    return GatesOf(xs, Download(xm), kv, hc, d);
  };
  std::vector<double> g = gates(1.0f);
  EXPECT_GT(g[0], 0.5);
  EXPECT_LT(g[1], 0.5);
  // |dot| = 1e-8 * sqrt(D) < 1e-6: the floor gives sigmoid(+-sqrt(1e-6)).
  g = gates(1e-8f);
  EXPECT_GT(g[0], 0.5);
  EXPECT_LT(g[1], 0.5);
  EXPECT_NEAR(g[0], RefSigmoid(1e-3), 1e-6);
  EXPECT_NEAR(g[1], RefSigmoid(-1e-3), 1e-6);
  // dot == 0: sign 0, gate exactly one half.
  g = gates(0.0f);
  EXPECT_NEAR(g[0], 0.5, 1e-6);
  EXPECT_NEAR(g[1], 0.5, 1e-6);
}

// ---- MoE
// ---------------------------------------------------------------------------

double RefScore(float logit) {
  return std::sqrt(std::log1p(std::exp(double{logit})));
}

TEST_P(CpuBackendTest, MoeRouteBreaksTiesByLowerExpertId) {
  const int top_k = 3;
  Mat logits = Upload({0.3f, 0.3f, 0.3f, 0.3f, 0.3f, 0.3f,  // all equal
                       1.0f, 2.0f, 0.0f, 2.0f, 2.0f, -1.0f},
                      2, 6);
  std::vector<int32_t> ids(2 * top_k);
  std::vector<float> weights(2 * top_k);
  backend_->MoeRoute(logits.view, nullptr, top_k, 1.5f, absl::MakeSpan(ids),
                     absl::MakeSpan(weights));
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2, 1, 3, 4}));
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(weights[i], 0.5f, 1e-6);
}

TEST_P(CpuBackendTest, MoeRouteBiasSelectsButDoesNotWeigh) {
  const int64_t tokens = 5, experts = 16;
  const int top_k = 4;
  const float scaling = 2.5f;
  const std::vector<float> logits = Random(tokens * experts, -3, 3);
  std::vector<float> bias(experts, 0.0f);
  bias[13] = 10.0f;  // always chosen, first
  bias[2] = 5.0f;    // always chosen, second
  Mat lm = Upload(logits, tokens, experts), bm = Upload(bias, 1, experts);
  std::vector<int32_t> ids(tokens * top_k), unbiased_ids(tokens * top_k);
  std::vector<float> weights(tokens * top_k), unbiased(tokens * top_k);
  backend_->MoeRoute(lm.view, bm.data(), top_k, scaling, absl::MakeSpan(ids),
                     absl::MakeSpan(weights));
  backend_->MoeRoute(lm.view, nullptr, top_k, scaling,
                     absl::MakeSpan(unbiased_ids), absl::MakeSpan(unbiased));
  for (int64_t t = 0; t < tokens; ++t) {
    SCOPED_TRACE(t);
    // Reference selection and weights.
    std::vector<int32_t> order(experts);
    std::iota(order.begin(), order.end(), 0);
    for (const std::vector<float>* b :
         {&bias, static_cast<std::vector<float>*>(nullptr)}) {
      std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) {
        const double bx = RefScore(logits[t * experts + x]) + (b ? (*b)[x] : 0);
        const double by = RefScore(logits[t * experts + y]) + (b ? (*b)[y] : 0);
        return bx > by;
      });
      const std::vector<int32_t>& got = b ? ids : unbiased_ids;
      const std::vector<float>& got_w = b ? weights : unbiased;
      double sum = 0;
      for (int i = 0; i < top_k; ++i)
        sum += RefScore(logits[t * experts + order[i]]);
      double total = 0;
      for (int i = 0; i < top_k; ++i) {
        EXPECT_EQ(got[t * top_k + i], order[i]);
        EXPECT_NEAR(got_w[t * top_k + i],
                    RefScore(logits[t * experts + order[i]]) / sum * scaling,
                    1e-5);
        total += got_w[t * top_k + i];
      }
      EXPECT_NEAR(total, scaling, 1e-5);
      std::iota(order.begin(), order.end(), 0);
    }
    EXPECT_EQ(ids[t * top_k], 13);
    EXPECT_EQ(ids[t * top_k + 1], 2);
  }
}

// Reference ExpertForward; counts the values each clamp changed.
std::vector<double> RefExpert(const std::vector<float>& x_all, int64_t d,
                              const std::vector<int32_t>& rows,
                              const std::vector<float>& weights,
                              const std::vector<double>& w1,
                              const std::vector<double>& w2,
                              const std::vector<double>& w3, int64_t inter,
                              double limit, const std::vector<float>& y0,
                              int* clamped_high, int* clamped_low) {
  std::vector<double> y(y0.begin(), y0.end());
  for (size_t n = 0; n < rows.size(); ++n) {
    const float* x = &x_all[rows[n] * d];
    std::vector<double> h(inter);
    for (int64_t i = 0; i < inter; ++i) {
      double a = 0, b = 0;
      for (int64_t k = 0; k < d; ++k) {
        a += x[k] * w1[i * d + k];
        b += x[k] * w3[i * d + k];
      }
      if (limit > 0) {
        if (a > limit) ++*clamped_high;
        if (b < -limit) ++*clamped_low;
        a = std::min(a, limit);
        b = std::clamp(b, -limit, limit);
      }
      h[i] = a / (1 + std::exp(-a)) * b;
    }
    for (int64_t k = 0; k < d; ++k) {
      double o = 0;
      for (int64_t i = 0; i < inter; ++i) o += h[i] * w2[k * inter + i];
      y[rows[n] * d + k] += weights[n] * o;
    }
  }
  return y;
}

TEST_P(CpuBackendTest, ExpertForwardClampsAndAccumulates) {
  const int64_t d = 32, inter = 64, n_all = 6;
  for (WeightFormat format : {WeightFormat::kF32, WeightFormat::kMxfp4}) {
    SCOPED_TRACE(static_cast<int>(format));
    const EncodedWeight w1 = Encode(format, inter, d, rng_);
    const EncodedWeight w2 = Encode(format, d, inter, rng_);
    const EncodedWeight w3 = Encode(format, inter, d, rng_);
    std::unique_ptr<Weight> u1 = MustUpload(w1.host()),
                            u2 = MustUpload(w2.host()),
                            u3 = MustUpload(w3.host());
    ASSERT_TRUE(u1 && u2 && u3);
    const std::vector<float> x_all = Random(n_all * d, -1, 1);
    const std::vector<float> y0 = Random(n_all * d);
    const std::vector<int32_t> rows = {4, 0, 2};
    const std::vector<float> weights = {0.5f, 1.5f, -0.25f};
    Mat xm = Upload(x_all, n_all, d);
    for (float limit : {1.0f, 0.0f, -1.0f}) {
      SCOPED_TRACE(limit);
      int high = 0, low = 0;
      const std::vector<double> ref =
          RefExpert(x_all, d, rows, weights, w1.values, w2.values, w3.values,
                    inter, limit, y0, &high, &low);
      if (limit > 0) {
        EXPECT_GT(high, 0);
        EXPECT_GT(low, 0);
      }
      Mat ym = Upload(y0, n_all, d);
      backend_->ExpertForward(xm.view, rows, weights, *u1, *u2, *u3, limit,
                              ym.view);
      double magnitude = 0;
      for (double v : ref) magnitude = std::max(magnitude, std::fabs(v));
      ExpectAllNear(Download(ym), ref, 1e-5 * magnitude);
    }
  }
}

// ---- sampling
// --------------------------------------------------------------------

double RefLogSoftmax(const std::vector<float>& row, int32_t id) {
  double max = -kInf;
  for (float v : row) max = std::max(max, double{v});
  double sum = 0;
  for (float v : row) sum += std::exp(v - max);
  return row[id] - max - std::log(sum);
}

class SampleTest : public CpuBackendTest {
 protected:
  // Samples one row of `logits` with `params` once per seed in [0, draws).
  std::vector<int32_t> Draw(const std::vector<float>& logits,
                            SamplingParams params, int draws) {
    const int64_t vocab = logits.size();
    std::vector<float> all;
    std::vector<SamplingParams> per_row;
    for (int i = 0; i < draws; ++i) {
      all.insert(all.end(), logits.begin(), logits.end());
      params.seed = static_cast<uint64_t>(i) * 7919 + 1;
      per_row.push_back(params);
    }
    Mat lm = Upload(all, draws, vocab);
    std::vector<int32_t> ids(draws);
    std::vector<float> logprobs(draws);
    backend_->Sample(lm.view, per_row, absl::MakeSpan(ids),
                     absl::MakeSpan(logprobs));
    for (int i = 0; i < draws; ++i) {
      EXPECT_NEAR(logprobs[i], RefLogSoftmax(logits, ids[i]), 1e-5);
    }
    return ids;
  }

  static std::vector<float> LogsOf(const std::vector<double>& p) {
    std::vector<float> l;
    for (double v : p) l.push_back(static_cast<float>(std::log(v)));
    return l;
  }
};

TEST_P(SampleTest, GreedyTakesTheLowestIdOfTheMaximum) {
  const std::vector<int32_t> ids =
      Draw({1.0f, 5.0f, 5.0f, 2.0f}, SamplingParams{}, 3);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 1, 1}));
}

TEST_P(SampleTest, SameSeedSameToken) {
  const std::vector<float> logits = Random(50, -0.5f, 0.5f);
  SamplingParams params{.temperature = 1.0f};
  const std::vector<int32_t> first = Draw(logits, params, 200);
  EXPECT_EQ(Draw(logits, params, 200), first);
  EXPECT_GT(std::set<int32_t>(first.begin(), first.end()).size(), 20u);
  // Same seed on every row of a batch: the same token on every row.
  params.seed = 42;
  Mat lm = Upload(
      [&] {
        std::vector<float> all;
        for (int i = 0; i < 4; ++i)
          all.insert(all.end(), logits.begin(), logits.end());
        return all;
      }(),
      4, 50);
  std::vector<int32_t> ids(4);
  std::vector<float> logprobs(4);
  backend_->Sample(lm.view, std::vector<SamplingParams>(4, params),
                   absl::MakeSpan(ids), absl::MakeSpan(logprobs));
  EXPECT_EQ(ids, std::vector<int32_t>(4, ids[0]));
}

TEST_P(SampleTest, TopKOneIsGreedy) {
  for (int round = 0; round < 5; ++round) {
    std::vector<float> logits = Random(100, -2, 2);
    logits[60] = logits[17] = 2.5f;  // a tie: 17 wins
    const std::vector<int32_t> ids =
        Draw(logits, SamplingParams{.temperature = 1.5f, .top_k = 1}, 50);
    EXPECT_EQ(ids, std::vector<int32_t>(50, 17));
  }
}

TEST_P(SampleTest, TopKKeepsOnlyTheBest) {
  std::vector<float> logits = Random(40, 0.0f, 1.5f);
  logits[7] = 2.0f;
  logits[3] = 1.9f;
  const std::vector<int32_t> ids =
      Draw(logits, SamplingParams{.temperature = 1.0f, .top_k = 2}, 200);
  EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.end()),
            (std::set<int32_t>{3, 7}));
}

TEST_P(SampleTest, TopPKeepsTheSmallestSufficientSet) {
  const std::vector<float> logits = LogsOf({0.2, 0.5, 0.3});
  std::vector<int32_t> ids =
      Draw(logits, SamplingParams{.temperature = 1.0f, .top_p = 0.7f}, 200);
  EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.end()),
            (std::set<int32_t>{1, 2}));
  ids = Draw(logits, SamplingParams{.temperature = 1.0f, .top_p = 0.45f}, 200);
  EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.end()), (std::set<int32_t>{1}));
  // After top_k = 2 the survivors renormalise to 0.625 / 0.375: top_p 0.6
  // keeps the first alone.
  ids =
      Draw(logits,
           SamplingParams{.temperature = 1.0f, .top_p = 0.6f, .top_k = 2}, 200);
  EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.end()), (std::set<int32_t>{1}));
}

TEST_P(SampleTest, MinPDropsUnlikelyTokens) {
  const std::vector<float> logits = LogsOf({0.2, 0.5, 0.3});
  std::vector<int32_t> ids =
      Draw(logits, SamplingParams{.temperature = 1.0f, .min_p = 0.5f}, 200);
  EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.end()),
            (std::set<int32_t>{1, 2}));
  ids = Draw(logits, SamplingParams{.temperature = 1.0f, .min_p = 0.7f}, 200);
  EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.end()), (std::set<int32_t>{1}));
}

TEST_P(SampleTest, FrequenciesFollowTheDistribution) {
  // p = (0.75, 0.25); temperature 2 flattens it to (0.634, 0.366).
  const std::vector<float> logits = LogsOf({0.75, 0.25});
  for (auto [temperature, p0] : {std::pair{1.0f, 0.75}, {2.0f, 0.634}}) {
    const std::vector<int32_t> ids =
        Draw(logits, SamplingParams{.temperature = temperature}, 2000);
    const double zeros = std::count(ids.begin(), ids.end(), 0) / 2000.0;
    EXPECT_NEAR(zeros, p0, 0.05) << "temperature " << temperature;
  }
}

TEST_P(CpuBackendTest, LogProbsMatchReference) {
  const int64_t tokens = 3, vocab = 1000;
  const std::vector<float> logits = Random(tokens * vocab, -10, 10);
  const std::vector<int32_t> ids = {0, 999, 512};
  Mat lm = Upload(logits, tokens, vocab);
  std::vector<float> logprobs(tokens);
  backend_->LogProbs(lm.view, ids, absl::MakeSpan(logprobs));
  for (int64_t t = 0; t < tokens; ++t) {
    const std::vector<float> row(logits.begin() + t * vocab,
                                 logits.begin() + (t + 1) * vocab);
    EXPECT_NEAR(logprobs[t], RefLogSoftmax(row, ids[t]), 1e-5);
  }
}

// One thread (everything inline) and several (the pool splits loops).
INSTANTIATE_TEST_SUITE_P(Threads, CpuBackendTest, ::testing::Values(1, 3));
INSTANTIATE_TEST_SUITE_P(Threads, SampleTest, ::testing::Values(1, 3));

}  // namespace
}  // namespace mneme::gpu
