#include "tools/quant/gptq.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "formats/e2m1.h"
#include "formats/e4m3.h"
#include "formats/row_decode.h"
#include "formats/row_encode.h"
#include "gtest/gtest.h"
#include "tools/synthetic/synthetic_checkpoint.h"

namespace mneme::quant {
namespace {

constexpr int kN = 256;
constexpr int R = kGptqChunkRows;

// Deterministic uniforms in [0, 1).
class Lcg {
 public:
  explicit Lcg(uint64_t seed) : state_(seed * 2 + 1) {}
  double Uniform() {
    state_ = state_ * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(state_ >> 11) * 0x1p-53;
  }
  double Normal() { return (Uniform() + Uniform() + Uniform() - 1.5) * 2.0; }

 private:
  uint64_t state_;
};

// W [out, 256]: inputs correlated along the row (AR(1), rho 0.9), as the
// synthetic "correlated" wkv; or independent entries.
std::vector<double> MakeW(int out, bool correlated, uint64_t seed) {
  Lcg lcg(seed);
  std::vector<double> w(static_cast<size_t>(out) * kN);
  for (int o = 0; o < out; ++o) {
    double a = 0;
    for (int j = 0; j < kN; ++j) {
      const double z = lcg.Normal();
      a = (!correlated || j == 0) ? z : 0.9 * a + std::sqrt(1 - 0.81) * z;
      w[o * kN + j] = a * (0.5 + 1.5 * ((j * 37) % 17) / 17.0);
    }
  }
  return w;
}

std::vector<double> Hessian(const std::vector<double>& w, int out) {
  std::vector<double> h(size_t{kN} * kN, 0.0);
  for (int o = 0; o < out; ++o) {
    for (int i = 0; i < kN; ++i) {
      for (int j = 0; j < kN; ++j)
        h[i * kN + j] += w[o * kN + i] * w[o * kN + j];
    }
  }
  return h;
}

std::vector<float> Fp8Rows(int64_t count, uint64_t seed) {
  std::vector<float> values(count * kN);
  std::vector<float> row(kN);
  std::vector<uint8_t> fp8(264);
  for (int64_t r = 0; r < count; ++r) {
    synthetic::SyntheticRowValues(seed, 1, r, absl::MakeSpan(row));
    EXPECT_TRUE(formats::EncodeFp8Row(row, absl::MakeSpan(fp8)).ok());
    EXPECT_TRUE(
        formats::DecodeRowsF32({.format = formats::RowFormat::kFp8}, fp8,
                               absl::MakeSpan(values).subspan(r * kN, kN))
            .ok());
  }
  return values;
}

struct Quantized {
  std::vector<uint8_t> codes;   // [rows, 256]
  std::vector<uint8_t> scales;  // [rows, 16]
  std::vector<float> values;    // decoded, [rows, 256]
};

float Decode(uint8_t code, uint8_t scale, float gs) {
  return (formats::E2m1ToFloat(code) * formats::E4m3ToFloat(scale)) * gs;
}

Quantized RunGptq(const ColumnFactor& factor, const std::vector<float>& rows,
                  float gs, ScaleChoice choice, int batch) {
  const int64_t n = static_cast<int64_t>(rows.size()) / kN;
  Quantized q;
  q.codes.resize(n * kN);
  q.scales.resize(n * 16);
  q.values.resize(n * kN);
  std::vector<float> work(size_t{kN} * R);
  std::vector<uint8_t> codes(size_t{R} * kN), scales(size_t{R} * 16);
  for (int64_t first = 0; first < n; first += R) {
    const int64_t m = std::min<int64_t>(R, n - first);
    for (int i = 0; i < kN; ++i) {
      for (int r = 0; r < R; ++r) {
        work[i * R + r] = r < m ? rows[(first + r) * kN + i] : 0.0f;
      }
    }
    GptqQuantizeChunk(
        factor, {.global_scale = gs, .scale = choice, .batch_columns = batch},
        work.data(), codes.data(), scales.data());
    for (int64_t r = 0; r < m; ++r) {
      std::copy_n(codes.data() + r * kN, kN, q.codes.data() + (first + r) * kN);
      std::copy_n(scales.data() + r * 16, 16,
                  q.scales.data() + (first + r) * 16);
    }
    // Padding rows stay zero.
    for (int64_t r = m; r < R; ++r) {
      for (int b = 0; b < 16; ++b) EXPECT_EQ(scales[r * 16 + b], 0);
    }
  }
  for (int64_t r = 0; r < n; ++r) {
    for (int i = 0; i < kN; ++i) {
      q.values[r * kN + i] =
          Decode(q.codes[r * kN + i], q.scales[r * 16 + i / 16], gs);
    }
  }
  return q;
}

Quantized RunRtn(const std::vector<float>& rows, float gs, ScaleChoice choice) {
  const int64_t n = static_cast<int64_t>(rows.size()) / kN;
  Quantized q;
  q.codes.resize(n * kN);
  q.scales.resize(n * 16);
  q.values.resize(n * kN);
  for (int64_t r = 0; r < n; ++r) {
    uint8_t packed[128];
    QuantizeRowRtn(rows.data() + r * kN, gs, choice, packed,
                   q.scales.data() + r * 16);
    for (int i = 0; i < kN; ++i) {
      q.codes[r * kN + i] = (packed[i / 2] >> (4 * (i % 2))) & 0xF;
      q.values[r * kN + i] =
          Decode(q.codes[r * kN + i], q.scales[r * 16 + i / 16], gs);
    }
  }
  return q;
}

// sum over rows of (q - x)^T H (q - x).
double ErrorThroughW(const std::vector<double>& h, const std::vector<float>& x,
                     const std::vector<float>& q) {
  const int64_t n = static_cast<int64_t>(x.size()) / kN;
  double total = 0;
  std::vector<double> e(kN);
  for (int64_t r = 0; r < n; ++r) {
    for (int i = 0; i < kN; ++i) e[i] = q[r * kN + i] - x[r * kN + i];
    for (int i = 0; i < kN; ++i) {
      for (int j = 0; j < kN; ++j) total += e[i] * h[i * kN + j] * e[j];
    }
  }
  return total;
}

TEST(MakeColumnFactorTest, UpperFactorOfTheInverseDampedHessian) {
  const std::vector<double> w = MakeW(320, true, 1);
  const std::vector<double> h = Hessian(w, 320);
  absl::StatusOr<ColumnFactor> f = MakeColumnFactor(h, 0.01);
  ASSERT_TRUE(f.ok()) << f.status();
  double mean_diag = 0;
  for (int i = 0; i < kN; ++i) mean_diag += h[i * kN + i];
  mean_diag /= kN;
  EXPECT_NEAR(f->damp, 0.01 * mean_diag, 1e-9 * mean_diag);
  for (int i = 0; i < kN; ++i) {
    for (int j = 0; j < i; ++j) ASSERT_EQ(f->upper[i * kN + j], 0.0f);
    EXPECT_FLOAT_EQ(f->hessian[i * kN + (kN - 1 - i)],
                    static_cast<float>(h[i * kN + (kN - 1 - i)]));
  }
  // (U^T U) (H + damp I) = I.
  std::vector<double> hinv(size_t{kN} * kN, 0.0);
  for (int i = 0; i < kN; ++i) {
    for (int j = 0; j < kN; ++j) {
      double s = 0;
      for (int k = 0; k <= std::min(i, j); ++k) {
        s += static_cast<double>(f->upper[k * kN + i]) * f->upper[k * kN + j];
      }
      hinv[i * kN + j] = s;
    }
  }
  double worst = 0;
  for (int i = 0; i < kN; ++i) {
    for (int j = 0; j < kN; ++j) {
      double s = 0;
      for (int k = 0; k < kN; ++k) {
        s += hinv[i * kN + k] * (h[k * kN + j] + (k == j ? f->damp : 0.0));
      }
      worst = std::max(worst, std::fabs(s - (i == j ? 1.0 : 0.0)));
    }
  }
  EXPECT_LT(worst, 1e-3);
}

TEST(MakeColumnFactorTest, ZeroHessianGivesTheIdentity) {
  absl::StatusOr<ColumnFactor> f =
      MakeColumnFactor(std::vector<double>(size_t{kN} * kN, 0.0));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->damp, 1.0);
  for (int i = 0; i < kN; ++i) {
    for (int j = 0; j < kN; ++j) {
      EXPECT_FLOAT_EQ(f->upper[i * kN + j], i == j ? 1.0f : 0.0f);
    }
  }
}

TEST(MakeColumnFactorTest, RejectsBadInput) {
  EXPECT_EQ(MakeColumnFactor(std::vector<double>(10, 0.0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<double> h(size_t{kN} * kN, 0.0);
  for (int i = 0; i < kN; ++i) h[i * kN + i] = 1.0;
  h[5 * kN + 5] = NAN;
  EXPECT_EQ(MakeColumnFactor(h).status().code(),
            absl::StatusCode::kInvalidArgument);
  h[5 * kN + 5] = -50.0;
  EXPECT_EQ(MakeColumnFactor(h).status().code(),
            absl::StatusCode::kInvalidArgument);
  h[5 * kN + 5] = 1.0;
  EXPECT_EQ(MakeColumnFactor(h, -1.0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GptqTest, DiagonalHessianIsExactlyRtn) {
  // Off-diagonal feedback is zero, so every code equals round-to-nearest.
  std::vector<double> h(size_t{kN} * kN, 0.0);
  for (int i = 0; i < kN; ++i) h[i * kN + i] = 3.0;
  absl::StatusOr<ColumnFactor> f = MakeColumnFactor(h);
  ASSERT_TRUE(f.ok());
  const std::vector<float> rows = Fp8Rows(150, 2);
  const float gs = formats::Nvfp4GlobalScale(11.0f);
  for (ScaleChoice choice : {ScaleChoice::kAmax, ScaleChoice::kMse}) {
    const Quantized g = RunGptq(*f, rows, gs, choice, 32);
    const Quantized r = RunRtn(rows, gs, choice);
    EXPECT_EQ(g.codes, r.codes);
    EXPECT_EQ(g.scales, r.scales);
  }
}

TEST(GptqTest, NotWorseThanRtnThroughTheSameW) {
  const float gs = formats::Nvfp4GlobalScale(11.0f);
  const std::vector<float> rows = Fp8Rows(512, 4);
  for (bool correlated : {true, false}) {
    const std::vector<double> w = MakeW(320, correlated, 7);
    const std::vector<double> h = Hessian(w, 320);
    absl::StatusOr<ColumnFactor> f = MakeColumnFactor(h);
    ASSERT_TRUE(f.ok());
    for (ScaleChoice choice : {ScaleChoice::kAmax, ScaleChoice::kMse}) {
      const double gptq =
          ErrorThroughW(h, rows, RunGptq(*f, rows, gs, choice, 32).values);
      const double rtn =
          ErrorThroughW(h, rows, RunRtn(rows, gs, choice).values);
      EXPECT_LE(gptq, rtn) << "correlated " << correlated << " choice "
                           << static_cast<int>(choice);
      if (correlated) {
        // With correlated inputs the feedback pays off clearly.
        EXPECT_LT(gptq, 0.9 * rtn);
      }
    }
  }
}

// GPTQ written out plainly in double precision: every error is fed into
// every later value at once (no lazy batches).
Quantized ReferenceGptq(const ColumnFactor& f, const std::vector<float>& rows,
                        float gs, ScaleChoice choice) {
  const int64_t n = static_cast<int64_t>(rows.size()) / kN;
  Quantized q;
  q.codes.resize(n * kN);
  q.scales.resize(n * 16);
  q.values.resize(n * kN);
  for (int64_t r = 0; r < n; ++r) {
    std::vector<double> x(rows.begin() + r * kN, rows.begin() + (r + 1) * kN);
    uint8_t scale = 0;
    for (int i = 0; i < kN; ++i) {
      if (i % 16 == 0) {
        float block[16];
        for (int k = 0; k < 16; ++k) block[k] = static_cast<float>(x[i + k]);
        scale = ChooseBlockScale(block, gs, choice);
        q.scales[r * 16 + i / 16] = scale;
      }
      const float step = formats::E4m3ToFloat(scale) * gs;
      const uint8_t code = Nvfp4Code(static_cast<float>(x[i]), step);
      q.codes[r * kN + i] = code;
      q.values[r * kN + i] = Decode(code, scale, gs);
      const double e = (x[i] - q.values[r * kN + i]) / f.upper[i * kN + i];
      for (int j = i + 1; j < kN; ++j) x[j] -= e * f.upper[i * kN + j];
    }
  }
  return q;
}

TEST(GptqTest, LazyBatchesAgreeWithThePlainAlgorithm) {
  const std::vector<double> w = MakeW(320, true, 11);
  const std::vector<double> h = Hessian(w, 320);
  absl::StatusOr<ColumnFactor> f = MakeColumnFactor(h);
  ASSERT_TRUE(f.ok());
  const float gs = formats::Nvfp4GlobalScale(11.0f);
  const std::vector<float> rows = Fp8Rows(256, 8);
  const Quantized ref = ReferenceGptq(*f, rows, gs, ScaleChoice::kMse);
  const double ref_error = ErrorThroughW(h, rows, ref.values);
  for (int batch : {16, 32, 64, 256}) {
    const Quantized got = RunGptq(*f, rows, gs, ScaleChoice::kMse, batch);
    int64_t same = 0;
    for (size_t i = 0; i < got.codes.size(); ++i) {
      same += got.codes[i] == ref.codes[i];
    }
    // fp32 vs double rounding flips a few codes at ties; the result is the
    // same algorithm.
    EXPECT_GT(same, static_cast<int64_t>(got.codes.size() * 0.99))
        << "batch " << batch;
    EXPECT_NEAR(ErrorThroughW(h, rows, got.values), ref_error, 0.01 * ref_error)
        << "batch " << batch;
  }
}

}  // namespace
}  // namespace mneme::quant
