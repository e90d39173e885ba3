#include "tests/gpu/backend_conformance/conformance_test_base.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
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

namespace mneme::gpu::conformance {

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

HostWeight EncodedWeight::host() const {
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

// Random values of a [rows, cols] weight in `format`, encoded with the
// project's encoders and decoded back with the reference decoders above.
EncodedWeight Encode(WeightFormat format, int64_t rows, int64_t cols,
                     std::mt19937& rng, int block_rows, int block_cols) {
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
    case WeightFormat::kExl3:      // codebook_weights_test.cc
    case WeightFormat::kGridbook:  // codebook_weights_test.cc
    case WeightFormat::kUnspecified:
      break;
  }
  return w;
}

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

void ExpectSameBits(const std::vector<float>& actual,
                    const std::vector<float>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(actual[i]),
              std::bit_cast<uint32_t>(expected[i]))
        << "at " << i << ": " << actual[i] << " vs " << expected[i];
  }
}

void BackendConformanceTest::SetUp() {
  absl::StatusOr<std::unique_ptr<Backend>> backend = GetParam().create();
  if (absl::IsUnavailable(backend.status())) {
    GTEST_SKIP() << GetParam().name << ": " << backend.status();
  }
  ASSERT_TRUE(backend.ok()) << backend.status();
  backend_ = std::move(*backend);
}

Mat BackendConformanceTest::Zeros(int64_t rows, int64_t cols) {
  absl::StatusOr<std::unique_ptr<Buffer>> buffer =
      backend_->Allocate(rows * cols);
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  Mat m{std::move(*buffer), {}};
  m.view = m.buffer->view(rows, cols);
  return m;
}

Mat BackendConformanceTest::Upload(const std::vector<float>& values,
                                   int64_t rows, int64_t cols) {
  EXPECT_EQ(static_cast<int64_t>(values.size()), rows * cols);
  Mat m = Zeros(rows, cols);
  backend_->CopyFromHost(values, m.data());
  return m;
}

std::vector<float> BackendConformanceTest::Download(const Mat& m) {
  std::vector<float> out(m.view.rows * m.view.cols);
  backend_->CopyToHost(m.view.data, absl::MakeSpan(out));
  return out;
}

std::vector<float> BackendConformanceTest::Random(int64_t n, float lo,
                                                  float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng_);
  return v;
}

std::unique_ptr<Weight> BackendConformanceTest::MustUpload(
    const HostWeight& host) {
  absl::StatusOr<std::unique_ptr<Weight>> w = backend_->UploadWeight(host);
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? std::move(*w) : nullptr;
}

std::unique_ptr<Weight> BackendConformanceTest::F32Weight(
    const std::vector<float>& values, int64_t rows, int64_t cols) {
  HostWeight host;
  host.format = WeightFormat::kF32;
  host.rows = rows;
  host.cols = cols;
  host.data = absl::MakeConstSpan(
      reinterpret_cast<const uint8_t*>(values.data()), values.size() * 4);
  return MustUpload(host);
}

}  // namespace mneme::gpu::conformance
