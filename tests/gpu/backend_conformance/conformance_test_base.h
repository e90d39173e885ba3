#ifndef MNEME_TESTS_GPU_BACKEND_CONFORMANCE_CONFORMANCE_TEST_BASE_H_
#define MNEME_TESTS_GPU_BACKEND_CONFORMANCE_CONFORMANCE_TEST_BASE_H_

// What the Backend conformance tests share: independent decoders of the
// narrow formats, an encoder of random checkpoint weights, and the fixture
// that runs a test once per backend of BackendFactories().

#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gpu/backend.h"
#include "gtest/gtest.h"
#include "tests/gpu/backend_conformance/backend_factories.h"

namespace mneme::gpu::conformance {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- independent decoders of the narrow formats (the reference side) ------

double RefE4m3(uint8_t code);
double RefUe8m0(uint8_t code);
double RefE2m1(uint8_t nibble);
double RefSigmoid(double x);

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

  HostWeight host() const;
};

// Random values of a [rows, cols] weight in `format`, encoded with the
// project's encoders and decoded back with the reference decoders above.
EncodedWeight Encode(WeightFormat format, int64_t rows, int64_t cols,
                     std::mt19937& rng, int block_rows = 32,
                     int block_cols = 32);

// A backend matrix with its buffer.
struct Mat {
  std::unique_ptr<Buffer> buffer;
  MatrixView view;
  float* data() { return view.data; }
};

// Expects |actual - expected| <= tolerance elementwise.
void ExpectAllNear(const std::vector<float>& actual,
                   const std::vector<double>& expected, double tolerance);
// Expects the same floats, bit for bit.
void ExpectSameBits(const std::vector<float>& actual,
                    const std::vector<float>& expected);

// Runs each test on a fresh backend made by the parameter's factory.
class BackendConformanceTest : public ::testing::TestWithParam<BackendFactory> {
 protected:
  void SetUp() override;

  Mat Zeros(int64_t rows, int64_t cols);
  Mat Upload(const std::vector<float>& values, int64_t rows, int64_t cols);
  std::vector<float> Download(const Mat& m);
  std::vector<float> Random(int64_t n, float lo = -1.0f, float hi = 1.0f);
  std::unique_ptr<Weight> MustUpload(const HostWeight& host);
  std::unique_ptr<Weight> F32Weight(const std::vector<float>& values,
                                    int64_t rows, int64_t cols);

  std::unique_ptr<Backend> backend_;
  std::mt19937 rng_{20260401};
};

}  // namespace mneme::gpu::conformance

#endif  // MNEME_TESTS_GPU_BACKEND_CONFORMANCE_CONFORMANCE_TEST_BASE_H_
