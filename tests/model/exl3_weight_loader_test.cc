// WeightLoader on EXL3 modules: each tensor form exllamav3 writes (fp16
// suh / svh, legacy packed su / sv, the codebook markers) loads as the
// weight the formats' decoder defines; tensor-parallel slices of whole
// 128 blocks stay EXL3, others become the exact fp32 slice; modules it
// cannot serve are refused with the module named.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/dtype.h"
#include "checkpoint/safetensors_reader.h"
#include "checkpoint/safetensors_writer.h"
#include "formats/exl3/exl3.h"
#include "formats/fp16.h"
#include "gmock/gmock.h"
#include "gpu/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "model/weight_loader.h"

namespace mneme::model {
namespace {

using checkpoint::DType;
using ::testing::HasSubstr;

constexpr int64_t kIn = 256;   // k
constexpr int64_t kOut = 384;  // n
constexpr int kBits = 3;

struct Module {
  std::vector<uint8_t> trellis;
  std::vector<uint8_t> suh;  // fp16 [k]
  std::vector<uint8_t> svh;  // fp16 [n]
  std::vector<uint8_t> su;   // packed signs [k / 16]
  std::vector<uint8_t> sv;   // packed signs [n / 16]
};

std::vector<uint8_t> RandomBytes(size_t n, std::mt19937& rng) {
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

std::vector<uint8_t> Halves(int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = formats::FloatToFp16((rng() % 2 ? -0.02f : 0.02f) *
                                            (1.0f + (rng() % 100) / 100.0f));
    out.push_back(static_cast<uint8_t>(h & 0xFF));
    out.push_back(static_cast<uint8_t>(h >> 8));
  }
  return out;
}

std::vector<uint16_t> Words(const std::vector<uint8_t>& bytes) {
  std::vector<uint16_t> words(bytes.size() / 2);
  std::memcpy(words.data(), bytes.data(), bytes.size());
  return words;
}

// W^T (n x k) from the decoder, with the given fp16 scales.
std::vector<float> Dense(const Module& m, formats::exl3::Codebook codebook,
                         const std::vector<uint16_t>& suh,
                         const std::vector<uint16_t>& svh) {
  const std::vector<uint16_t> trellis = Words(m.trellis);
  std::vector<float> out(kOut * kIn);
  formats::exl3::DequantizeOutputRows({.in_features = kIn,
                                       .out_features = kOut,
                                       .bits = kBits,
                                       .codebook = codebook,
                                       .trellis = trellis.data(),
                                       .suh = suh.data(),
                                       .svh = svh.data()},
                                      0, kOut, out.data());
  return out;
}

class Exl3WeightLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(17);
    m_.trellis =
        RandomBytes(formats::exl3::TrellisBytes(kIn, kOut, kBits), rng);
    m_.suh = Halves(kIn, rng);
    m_.svh = Halves(kOut, rng);
    m_.su = RandomBytes(kIn / 8, rng);
    m_.sv = RandomBytes(kOut / 8, rng);
    path_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/exl3.safetensors");
    const std::vector<int64_t> trellis_shape = {kIn / 16, kOut / 16,
                                                int64_t{16} * kBits};
    std::vector<checkpoint::TensorDecl> decls;
    std::vector<std::pair<std::string, std::vector<uint8_t>>> data;
    auto add = [&](const std::string& name, DType dtype,
                   std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
      decls.push_back({name, dtype, std::move(shape)});
      data.emplace_back(name, std::move(bytes));
    };
    const std::vector<uint8_t> mcg = {0xED, 0x1F, 0xAC, 0xCB};
    const std::vector<uint8_t> mul1 = {0x2D, 0xD1, 0xDC, 0x83};
    // a: fp16 scales, MCG. b: legacy signs, 3INST. c: both markers.
    // d: a bias. e: no output scales. f: a trellis of the wrong shape.
    for (const char* name : {"a", "b", "c", "d", "e", "f"}) {
      const std::string n = name;
      add(n + ".trellis", DType::kI16,
          n == "f"
              ? std::vector<int64_t>{kOut / 16, kIn / 16, int64_t{16} * kBits}
              : trellis_shape,
          m_.trellis);
      if (n == "b") {
        add(n + ".su", DType::kI16, {kIn / 16}, m_.su);
        add(n + ".sv", DType::kI16, {kOut / 16}, m_.sv);
      } else {
        add(n + ".suh", DType::kF16, {kIn}, m_.suh);
        if (n != "e") add(n + ".svh", DType::kF16, {kOut}, m_.svh);
      }
      if (n != "b") add(n + ".mcg", DType::kI32, {}, mcg);
      if (n == "c") add(n + ".mul1", DType::kI32, {}, mul1);
      if (n == "d") add(n + ".bias", DType::kF16, {kOut}, m_.svh);
    }
    auto writer = checkpoint::SafetensorsWriter::Create(path_, decls);
    ASSERT_TRUE(writer.ok()) << writer.status();
    for (const auto& [name, bytes] : data) {
      ASSERT_TRUE((*writer)->Append(name, bytes).ok()) << name;
    }
    ASSERT_TRUE((*writer)->Finish().ok());
    auto reader = checkpoint::SafetensorsReader::Create(path_);
    ASSERT_TRUE(reader.ok()) << reader.status();
    reader_ = *std::move(reader);
    auto backend = gpu::CpuBackend::Create({.threads = 1});
    ASSERT_TRUE(backend.ok());
    backend_ = *std::move(backend);
    loader_ = std::make_unique<WeightLoader>(*reader_, *backend_, 128, 128,
                                             "exl3.safetensors");
  }

  // W^T as the backend holds it: Linear of the identity.
  std::vector<float> Materialize(const gpu::Weight& w) {
    const int64_t k = w.cols();
    const int64_t n = w.rows();
    std::vector<float> eye(k * k, 0.0f);
    for (int64_t i = 0; i < k; ++i) eye[i * k + i] = 1.0f;
    auto x = backend_->Allocate(k * k);
    auto y = backend_->Allocate(k * n);
    EXPECT_TRUE(x.ok() && y.ok());
    backend_->CopyFromHost(eye, (*x)->data());
    gpu::Backend& backend = *backend_;
    backend.Linear((*x)->view(k, k), w, (*y)->view(k, n));
    std::vector<float> yt(k * n);
    backend_->CopyToHost((*y)->data(), absl::MakeSpan(yt));
    std::vector<float> out(n * k);  // [n, k]
    for (int64_t i = 0; i < k; ++i) {
      for (int64_t j = 0; j < n; ++j) out[j * k + i] = yt[i * n + j];
    }
    return out;
  }

  Module m_;
  std::string path_;
  std::unique_ptr<checkpoint::SafetensorsReader> reader_;
  std::unique_ptr<gpu::CpuBackend> backend_;
  std::unique_ptr<WeightLoader> loader_;
};

void ExpectNear(const std::vector<float>& actual,
                const std::vector<float>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_NEAR(actual[i], expected[i], 1e-5 + 1e-4 * std::fabs(expected[i]))
        << i;
  }
}

TEST_F(Exl3WeightLoaderTest, FormsLoadAsTheDecodersWeight) {
  ASSERT_TRUE(loader_->CheckLinear("a", kOut, kIn).ok());
  auto a = loader_->Linear("a", kOut, kIn);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->format(), gpu::WeightFormat::kExl3);
  ExpectNear(Materialize(**a), Dense(m_, formats::exl3::Codebook::kMcg,
                                     Words(m_.suh), Words(m_.svh)));

  // Legacy signs: +-1 scales, and no marker: 3INST.
  auto b = loader_->Linear("b", kOut, kIn);
  ASSERT_TRUE(b.ok()) << b.status();
  std::vector<float> su(kIn), sv(kOut);
  formats::exl3::UnpackSigns(Words(m_.su).data(), kIn, su.data());
  formats::exl3::UnpackSigns(Words(m_.sv).data(), kOut, sv.data());
  std::vector<uint16_t> suh, svh;
  for (const float s : su) suh.push_back(formats::FloatToFp16(s));
  for (const float s : sv) svh.push_back(formats::FloatToFp16(s));
  ExpectNear(Materialize(**b),
             Dense(m_, formats::exl3::Codebook::k3Inst, suh, svh));
}

TEST_F(Exl3WeightLoaderTest, SlicesKeepBlocksOrBecomeExactFloats) {
  const std::vector<float> dense =
      Dense(m_, formats::exl3::Codebook::kMcg, Words(m_.suh), Words(m_.svh));
  struct Case {
    Slice rows;
    Slice cols;
    gpu::WeightFormat format;
  };
  for (const Case& c : {Case{{128, 256}, {}, gpu::WeightFormat::kExl3},
                        Case{{}, {128, 128}, gpu::WeightFormat::kExl3},
                        Case{{256, 128}, {0, 128}, gpu::WeightFormat::kExl3},
                        Case{{64, 64}, {}, gpu::WeightFormat::kF32},
                        Case{{}, {32, 96}, gpu::WeightFormat::kF32}}) {
    SCOPED_TRACE(testing::Message()
                 << "rows " << c.rows.begin << "+" << c.rows.count << " cols "
                 << c.cols.begin << "+" << c.cols.count);
    auto w = loader_->Linear("a", kOut, kIn, c.rows, c.cols);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ((*w)->format(), c.format);
    const int64_t r0 = c.rows.begin;
    const int64_t c0 = c.cols.begin;
    const int64_t rn = c.rows.count < 0 ? kOut - r0 : c.rows.count;
    const int64_t cn = c.cols.count < 0 ? kIn - c0 : c.cols.count;
    std::vector<float> expected;
    for (int64_t r = r0; r < r0 + rn; ++r) {
      for (int64_t i = c0; i < c0 + cn; ++i) {
        expected.push_back(dense[r * kIn + i]);
      }
    }
    ExpectNear(Materialize(**w), expected);
  }
}

TEST_F(Exl3WeightLoaderTest, RefusesWhatItCannotServe) {
  for (const auto& [name, what] :
       std::vector<std::pair<std::string, std::string>>{
           {"c", "both the mcg and mul1"},
           {"d", "d.bias"},
           {"e", "neither e.svh nor e.sv"},
           {"f", "I16 [16, 24, 16 * K]"}}) {
    const absl::Status check = loader_->CheckLinear(name, kOut, kIn);
    EXPECT_EQ(check.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(check.message(), HasSubstr(what)) << name;
    auto w = loader_->Linear(name, kOut, kIn);
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << name;
  }
  // A shape the config does not imply.
  EXPECT_EQ(loader_->Linear("a", kIn, kOut).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mneme::model
