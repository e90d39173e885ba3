// Backend conformance for the codebook weight formats (EXL3 trellis,
// GridBook superblocks): Linear on the weight in its stored form equals the
// product with the weight dequantized in double from the formats' decoders
// (What and the codeword values, which tests/formats checks against the
// producers' references), for decode-sized and prefill-sized batches, with
// and without accumulate; UploadWeight refuses bad sizes and non-finite
// scales.

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "formats/e4m3.h"
#include "formats/exl3/exl3.h"
#include "formats/fp16.h"
#include "formats/gridbook/gridbook.h"
#include "gpu/backend.h"
#include "gpu/sampling.h"
#include "gtest/gtest.h"
#include "tests/gpu/backend_conformance/backend_factories.h"
#include "tests/gpu/backend_conformance/conformance_test_base.h"

namespace mneme::gpu::conformance {
namespace {

namespace x3 = formats::exl3;
namespace gb = formats::gridbook;

struct Exl3Case {
  std::vector<uint8_t> trellis;
  std::vector<uint8_t> scales;  // suh then svh, fp16
  std::vector<double> values;   // [rows = n, cols = k]
};

// W = diag(su) H What H diag(sv) in double with the Hadamard matrix written
// out ((-1)^popcount(i & j) / sqrt(128)), transposed to [n, k].
Exl3Case MakeExl3(int64_t k, int64_t n, int bits, x3::Codebook codebook,
                  std::mt19937& rng) {
  Exl3Case c;
  c.trellis.resize(x3::TrellisBytes(k, n, bits));
  for (auto& b : c.trellis) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> magnitude(0.5f, 2.0f);
  std::vector<double> su(k);
  std::vector<double> sv(n);
  c.scales.resize(2 * (k + n));
  for (int64_t i = 0; i < k + n; ++i) {
    const uint16_t bits16 =
        formats::FloatToFp16((rng() % 2 ? -0.05f : 0.05f) * magnitude(rng));
    std::memcpy(c.scales.data() + 2 * i, &bits16, 2);
    (i < k ? su[i] : sv[i - k]) = formats::Fp16ToFloat(bits16);
  }
  std::vector<uint16_t> words(c.trellis.size() / 2);
  std::memcpy(words.data(), c.trellis.data(), c.trellis.size());
  std::vector<uint16_t> suh(k);
  std::vector<uint16_t> svh(n);
  const x3::Exl3Weight weight{.in_features = k,
                              .out_features = n,
                              .bits = bits,
                              .codebook = codebook,
                              .trellis = words.data(),
                              .suh = suh.data(),
                              .svh = svh.data()};
  std::vector<float> what(k * n);
  x3::DecodeTrellis(weight, what.data());
  const int h = x3::kHadamardSize;
  auto hadamard = [&](int64_t i, int64_t j) {
    return (__builtin_popcountll(i & j) % 2 == 0 ? 1.0 : -1.0) /
           std::sqrt(static_cast<double>(h));
  };
  // left = H_k What (k x n), then W = left H_n.
  std::vector<double> left(k * n, 0.0);
  for (int64_t i = 0; i < k; ++i) {
    const int64_t block = i / h * h;
    for (int64_t l = block; l < block + h; ++l) {
      const double factor = hadamard(i % h, l % h);
      for (int64_t j = 0; j < n; ++j)
        left[i * n + j] += factor * what[l * n + j];
    }
  }
  c.values.assign(n * k, 0.0);
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const int64_t block = j / h * h;
      double sum = 0.0;
      for (int64_t l = block; l < block + h; ++l) {
        sum += left[i * n + l] * hadamard(l % h, j % h);
      }
      c.values[j * k + i] = su[i] * sum * sv[j];
    }
  }
  return c;
}

struct GridbookCase {
  std::shared_ptr<gb::Codebooks> books;
  std::vector<uint8_t> data;
  std::vector<uint8_t> scale;
  std::vector<double> values;  // [rows, cols]
};

GridbookCase MakeGridbook(const gb::Scheme& scheme, int64_t rows, int64_t cols,
                          std::mt19937& rng, bool extreme_exponents = false) {
  GridbookCase c;
  c.books = std::make_shared<gb::Codebooks>();
  for (int sub = 0; sub < scheme.n_sub; ++sub) {
    const int64_t count =
        gb::SubTableRows(scheme, sub) * gb::SubTableColumns(scheme);
    for (int64_t i = 0; i < count; ++i) {
      float value;
      if (scheme.grid == gb::Grid::kFp4) {
        static constexpr float kE2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
        value = kE2m1[rng() % 8];
        if (scheme.mode == gb::Mode::kProduct && rng() % 2) value = -value;
      } else {
        uint8_t code = static_cast<uint8_t>(rng());
        if ((code & 0x7F) == 0x7F) code = 0x7E;
        value = formats::E4m3ToFloat(code);
      }
      c.books->tables[sub].push_back(value);
    }
  }
  const int64_t type_size = gb::TypeSize(scheme);
  const int64_t blocks = cols / gb::kSuperblock;
  c.data.resize(rows * blocks * type_size);
  for (auto& b : c.data) b = static_cast<uint8_t>(rng());
  std::vector<float> row_scales(rows, 1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t s = 0; s < blocks; ++s) {
      uint8_t* block = c.data.data() + (r * blocks + s) * type_size;
      uint8_t* plane = block + ptrdiff_t{4} * scheme.k;
      if (scheme.scale_coding == gb::ScaleCoding::kE4m3) {
        for (int g = 0; g < 16; ++g) plane[g] = 0x20 + rng() % 0x40;
      } else if (scheme.scale_coding == gb::ScaleCoding::kTwoTier) {
        // Mostly near 2^0; with extreme_exponents, every exponent byte
        // (scales that are subnormal, zero or infinite in fp32 included).
        plane[0] = extreme_exponents ? static_cast<uint8_t>(rng())
                                     : static_cast<uint8_t>(120 + rng() % 8);
      }
    }
    if (scheme.grid == gb::Grid::kFp8) {
      row_scales[r] = std::ldexp(1.0f + (rng() % 100) / 100.0f, -8);
    }
  }
  if (scheme.grid == gb::Grid::kFp8) {
    c.scale.resize(rows * 4);
    std::memcpy(c.scale.data(), row_scales.data(), c.scale.size());
  }
  c.values.resize(rows * cols);
  std::vector<float> decoded(gb::kSuperblock);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t s = 0; s < blocks; ++s) {
      gb::DecodeSuperblock(scheme, *c.books,
                           c.data.data() + (r * blocks + s) * type_size,
                           row_scales[r], decoded.data());
      for (int i = 0; i < gb::kSuperblock; ++i) {
        c.values[r * cols + s * gb::kSuperblock + i] = decoded[i];
      }
    }
  }
  return c;
}

// The HostWeight of a GridbookCase (borrows its bytes and tables).
HostWeight GridbookHost(const gb::Scheme& scheme, int64_t rows, int64_t cols,
                        const GridbookCase& g) {
  HostWeight host;
  host.format = WeightFormat::kGridbook;
  host.rows = rows;
  host.cols = cols;
  host.data = g.data;
  host.scale = g.scale;
  host.gridbook_scheme = scheme;
  host.gridbook_books = g.books;
  return host;
}

class CodebookWeightsTest : public BackendConformanceTest {
 protected:
  // Linear on `w` vs the double product with `values`, for several batch
  // sizes (decode and prefill paths), plain and accumulating.
  void ExpectLinearMatches(const Weight& w, const std::vector<double>& values,
                           int64_t outputs, int64_t inputs);
};

void CodebookWeightsTest::ExpectLinearMatches(const Weight& w,
                                              const std::vector<double>& values,
                                              int64_t outputs, int64_t inputs) {
  Backend& backend = *backend_;
  for (const int64_t tokens : {1, 3, 16, 17, 40}) {
    SCOPED_TRACE(testing::Message() << tokens << " tokens");
    const std::vector<float> x = Random(tokens * inputs);
    const std::vector<float> y0 = Random(tokens * outputs);
    std::vector<double> ref(tokens * outputs);
    double tolerance = 0;
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t r = 0; r < outputs; ++r) {
        double sum = 0;
        double magnitude = 0;
        for (int64_t c = 0; c < inputs; ++c) {
          sum += double{x[t * inputs + c]} * values[r * inputs + c];
          magnitude += std::fabs(x[t * inputs + c] * values[r * inputs + c]);
        }
        ref[t * outputs + r] = sum;
        tolerance = std::max(tolerance, 1e-5 * magnitude);
      }
    }
    Mat xm = Upload(x, tokens, inputs);
    Mat ym = Upload(std::vector<float>(tokens * outputs, std::nanf("")), tokens,
                    outputs);
    backend.Linear(xm.view, w, ym.view);
    ExpectAllNear(Download(ym), ref, tolerance + 1e-6);
    backend.CopyFromHost(y0, ym.data());
    backend.Linear(xm.view, w, ym.view, Backend::Accumulate::kYes);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += y0[i];
    ExpectAllNear(Download(ym), ref, tolerance + 1e-6);
  }
}

TEST_P(CodebookWeightsTest, Exl3LinearMatchesTheDequantizedWeight) {
  struct Case {
    int64_t k;
    int64_t n;
    int bits;
    x3::Codebook codebook;
  };
  for (const Case& c : {Case{256, 384, 2, x3::Codebook::kMul1},
                        Case{128, 128, 8, x3::Codebook::k3Inst},
                        Case{384, 256, 4, x3::Codebook::kMcg}}) {
    SCOPED_TRACE(testing::Message() << c.k << "x" << c.n << " K " << c.bits);
    const Exl3Case e = MakeExl3(c.k, c.n, c.bits, c.codebook, rng_);
    HostWeight host;
    host.format = WeightFormat::kExl3;
    host.rows = c.n;
    host.cols = c.k;
    host.data = e.trellis;
    host.scale = e.scales;
    host.exl3_bits = c.bits;
    host.exl3_codebook = c.codebook;
    std::unique_ptr<Weight> w = MustUpload(host);
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->format(), WeightFormat::kExl3);
    ExpectLinearMatches(*w, e.values, c.n, c.k);
    // The weight itself (W^T, [n, k]), within fp32 rounding of the
    // transforms.
    std::vector<float> decoded(c.n * c.k);
    backend_->DequantizeWeight(*w, absl::MakeSpan(decoded));
    double magnitude = 0;
    for (const double v : e.values)
      magnitude = std::max(magnitude, std::fabs(v));
    ExpectAllNear(decoded, e.values, 1e-5 * magnitude);
  }
}

TEST_P(CodebookWeightsTest, GridbookWeightsDecodeAsTheFormatBitForBit) {
  struct Case {
    const char* format;
    gb::ScaleCoding coding;
    bool own_table;  // a two-tier table of values bf16 cannot hold
    bool extreme_exponents;
  };
  for (const Case& c :
       {Case{"NVFP4_CB_K16", gb::ScaleCoding::kTwoTier, false, false},
        Case{"NVFP4_CB_K13", gb::ScaleCoding::kE4m3, false, false},
        Case{"NVFP4_CB_K31", gb::ScaleCoding::kTwoTier, true, true},
        Case{"NVFP4_CB_S12", gb::ScaleCoding::kTwoTier, true, false},
        Case{"NVFP4_CB_S21", gb::ScaleCoding::kE4m3, false, false},
        Case{"FP8_CB_K29", gb::ScaleCoding::kNone, false, false},
        Case{"FP8_CB_K45", gb::ScaleCoding::kNone, false, false}}) {
    SCOPED_TRACE(c.format);
    auto scheme = gb::SchemeForFormat(c.format, c.coding);
    ASSERT_TRUE(scheme.ok()) << scheme.status();
    if (c.own_table) {
      for (float& v : scheme->two_tier_table) {
        v = 1.0f + static_cast<float>(rng_() % 100000) / 65536.0f;
      }
    }
    const int64_t rows = 6;
    const int64_t cols = 512;
    const GridbookCase g =
        MakeGridbook(*scheme, rows, cols, rng_, c.extreme_exponents);
    std::unique_ptr<Weight> w =
        MustUpload(GridbookHost(*scheme, rows, cols, g));
    ASSERT_NE(w, nullptr);
    std::vector<float> decoded(rows * cols);
    backend_->DequantizeWeight(*w, absl::MakeSpan(decoded));
    int64_t mismatches = 0;
    for (int64_t i = 0; i < rows * cols; ++i) {
      const auto expected = static_cast<float>(g.values[i]);
      if (std::bit_cast<uint32_t>(decoded[i]) !=
              std::bit_cast<uint32_t>(expected) &&
          mismatches++ < 5) {
        ADD_FAILURE() << "element " << i << ": " << decoded[i] << " vs "
                      << expected;
      }
    }
    EXPECT_EQ(mismatches, 0);
  }
}

TEST_P(CodebookWeightsTest, GridbookLinearMatchesTheDequantizedWeight) {
  struct Case {
    const char* format;
    gb::ScaleCoding coding;
  };
  for (const Case& c : {Case{"NVFP4_CB_K16", gb::ScaleCoding::kTwoTier},
                        Case{"NVFP4_CB_K13", gb::ScaleCoding::kE4m3},
                        Case{"NVFP4_CB_S12", gb::ScaleCoding::kTwoTier},
                        Case{"FP8_CB_K29", gb::ScaleCoding::kNone}}) {
    SCOPED_TRACE(c.format);
    auto scheme = gb::SchemeForFormat(c.format, c.coding);
    ASSERT_TRUE(scheme.ok()) << scheme.status();
    const int64_t rows = 40;
    const int64_t cols = 512;
    const GridbookCase g = MakeGridbook(*scheme, rows, cols, rng_);
    std::unique_ptr<Weight> w =
        MustUpload(GridbookHost(*scheme, rows, cols, g));
    ASSERT_NE(w, nullptr);
    ExpectLinearMatches(*w, g.values, rows, cols);
  }
}

// A layer's routed experts in EXL3 (each expert's transforms around its
// products) against the products with the weights in double.
TEST_P(CodebookWeightsTest, Exl3ExpertsMatchTheDequantizedWeights) {
  const int64_t d = 128, inter = 128, tokens = 5, local = 2;
  const int top_k = 2;
  std::vector<Exl3Case> cases;
  std::vector<std::unique_ptr<Weight>> owned;
  std::vector<ExpertRef> experts;
  for (int64_t i = 0; i < 3 * local; ++i) {
    cases.push_back(MakeExl3(
        d, d, 3, i % 2 ? x3::Codebook::kMcg : x3::Codebook::kMul1, rng_));
    HostWeight host;
    host.format = WeightFormat::kExl3;
    host.rows = d;
    host.cols = d;
    host.data = cases.back().trellis;
    host.scale = cases.back().scales;
    host.exl3_bits = 3;
    host.exl3_codebook = i % 2 ? x3::Codebook::kMcg : x3::Codebook::kMul1;
    owned.push_back(MustUpload(host));
    ASSERT_NE(owned.back(), nullptr);
  }
  for (int64_t e = 0; e < local; ++e) {
    experts.push_back({.w1 = owned[3 * e].get(),
                       .w2 = owned[3 * e + 1].get(),
                       .w3 = owned[3 * e + 2].get()});
  }
  // Expert 0 takes tokens 0..4 (slot 0), expert 1 tokens 1 and 3 (slot 1).
  const std::vector<int32_t> ids = {0, -1, 0, 1, 0, -1, 0, 1, 0, -1};
  const std::vector<float> weights = Random(tokens * top_k, 0, 1);
  const std::vector<float> x = Random(tokens * d);
  std::vector<double> ref(tokens * d, 0.0);
  double magnitude = 0;
  for (int64_t a = 0; a < tokens * top_k; ++a) {
    if (ids[a] < 0) continue;
    const int64_t t = a / top_k;
    const size_t e = 3 * static_cast<size_t>(ids[a]);
    const std::vector<double>& w1 = cases[e].values;
    const std::vector<double>& w2 = cases[e + 1].values;
    const std::vector<double>& w3 = cases[e + 2].values;
    std::vector<double> h(inter);
    for (int64_t i = 0; i < inter; ++i) {
      double g = 0, u = 0;
      for (int64_t c = 0; c < d; ++c) {
        g += x[t * d + c] * w1[i * d + c];
        u += x[t * d + c] * w3[i * d + c];
      }
      h[i] = g / (1 + std::exp(-g)) * u;
    }
    for (int64_t r = 0; r < d; ++r) {
      double o = 0;
      for (int64_t i = 0; i < inter; ++i) o += h[i] * w2[r * inter + i];
      ref[t * d + r] += weights[a] * o;
      magnitude = std::max(magnitude, std::fabs(ref[t * d + r]));
    }
  }
  Mat xm = Upload(x, tokens, d);
  Mat ym = Zeros(tokens, d);
  backend_->MoeExperts(xm.view, ids, weights, top_k, 0, experts, 0.0f, ym.view);
  ExpectAllNear(Download(ym), ref, 1e-5 * magnitude);

  // MoeLayer over the same experts (the kernel backends group EXL3 experts
  // on the host) equals MoeRoute, then MoeExperts.
  Mat lm = Upload(Random(tokens * local, -2, 2), tokens, local);
  MoeRouting routing;
  routing.top_k = 1;
  Mat layer = Zeros(tokens, d);
  backend_->MoeLayer(xm.view, lm.view, routing, 0, experts, 0.0f, layer.view);
  std::vector<int32_t> routed(tokens);
  std::vector<float> routed_weights(tokens);
  backend_->MoeRoute(lm.view, nullptr, 1, 1.0f, absl::MakeSpan(routed),
                     absl::MakeSpan(routed_weights));
  Mat parts = Zeros(tokens, d);
  backend_->MoeExperts(xm.view, routed, routed_weights, 1, 0, experts, 0.0f,
                       parts.view);
  EXPECT_EQ(Download(layer), Download(parts));
  // Hash routing over them: the even tokens list expert 0 twice (added
  // once), the odd ones experts 0 and 1; equals MoeExperts with the
  // weights HashRoute gives.
  std::vector<int32_t> listed(tokens * 2);
  for (int64_t t = 0; t < tokens; ++t) {
    listed[t * 2] = 0;
    listed[t * 2 + 1] = static_cast<int32_t>(t % 2);
  }
  routing.top_k = 2;
  routing.hash_experts = listed;
  Mat hashed = Zeros(tokens, d);
  backend_->MoeLayer(xm.view, lm.view, routing, 0, experts, 0.0f, hashed.view);
  const std::vector<float> host_logits = Download(lm);
  std::vector<int32_t> hash_ids(tokens * 2);
  std::vector<float> hash_weights(tokens * 2);
  for (int64_t t = 0; t < tokens; ++t) {
    HashRoute(host_logits.data() + t * local,
              absl::MakeConstSpan(listed).subspan(t * 2, 2), 1.0f,
              hash_ids.data() + t * 2, hash_weights.data() + t * 2);
  }
  Mat hash_parts = Zeros(tokens, d);
  backend_->MoeExperts(xm.view, hash_ids, hash_weights, 2, 0, experts, 0.0f,
                       hash_parts.view);
  EXPECT_EQ(Download(hashed), Download(hash_parts));
  EXPECT_NE(Download(hashed), Download(layer));
}

TEST_P(CodebookWeightsTest, UploadRefusesBadCodebookWeights) {
  const Exl3Case e = MakeExl3(128, 128, 3, x3::Codebook::kMcg, rng_);
  HostWeight host;
  host.format = WeightFormat::kExl3;
  host.rows = 128;
  host.cols = 128;
  host.data = e.trellis;
  host.scale = e.scales;
  host.exl3_bits = 4;  // the trellis holds 3
  EXPECT_EQ(backend_->UploadWeight(host).status().code(),
            absl::StatusCode::kInvalidArgument);
  host.exl3_bits = 9;
  EXPECT_EQ(backend_->UploadWeight(host).status().code(),
            absl::StatusCode::kInvalidArgument);
  host.exl3_bits = 3;
  host.cols = 64;
  EXPECT_EQ(backend_->UploadWeight(host).status().code(),
            absl::StatusCode::kInvalidArgument);
  host.cols = 128;
  std::vector<uint8_t> scales = e.scales;
  const uint16_t nan = 0x7E00;
  std::memcpy(scales.data() + 400, &nan, 2);  // svh[72]
  host.scale = scales;
  EXPECT_EQ(backend_->UploadWeight(host).status().code(),
            absl::StatusCode::kDataLoss);

  auto scheme = gb::SchemeForFormat("NVFP4_CB_K12", gb::ScaleCoding::kE4m3);
  ASSERT_TRUE(scheme.ok());
  const GridbookCase g = MakeGridbook(*scheme, 4, 256, rng_);
  HostWeight gh;
  gh.format = WeightFormat::kGridbook;
  gh.rows = 4;
  gh.cols = 256;
  gh.data = g.data;
  gh.gridbook_scheme = *scheme;
  EXPECT_EQ(backend_->UploadWeight(gh).status().code(),
            absl::StatusCode::kInvalidArgument);  // no tables
  gh.gridbook_books = g.books;
  EXPECT_TRUE(backend_->UploadWeight(gh).ok());
  std::vector<uint8_t> data = g.data;
  data[2 * gb::TypeSize(*scheme) + 48 + 5] = 0x7F;  // row 2, NaN group scale
  gh.data = data;
  EXPECT_EQ(backend_->UploadWeight(gh).status().code(),
            absl::StatusCode::kDataLoss);
  gh.data = absl::MakeConstSpan(g.data).subspan(1);
  EXPECT_EQ(backend_->UploadWeight(gh).status().code(),
            absl::StatusCode::kInvalidArgument);
  gh.data = g.data;
  gh.cols = 128;
  EXPECT_EQ(backend_->UploadWeight(gh).status().code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Backends, CodebookWeightsTest,
                         ::testing::ValuesIn(BackendFactories()),
                         BackendFactoryName);

}  // namespace
}  // namespace mneme::gpu::conformance
