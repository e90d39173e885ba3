#include "engram_store/hashing/numpy_random.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engram_store/hashing/python_runner.h"

namespace mneme::engram {
namespace {

using ::mneme::engram::testing::ReadFile;
using ::mneme::engram::testing::RunfilePath;
using ::mneme::engram::testing::RunPython;
using ::mneme::engram::testing::TempPath;

std::vector<uint32_t> Words(const nlohmann::json& array) {
  std::vector<uint32_t> words;
  for (const nlohmann::json& w : array) words.push_back(w.get<uint32_t>());
  return words;
}

unsigned __int128 Halves(const nlohmann::json& pair) {
  return (static_cast<unsigned __int128>(pair[0].get<uint64_t>()) << 64) |
         pair[1].get<uint64_t>();
}

// The generator state numpy reports after the same draws.
void ExpectState(const Pcg64& bit_generator, const nlohmann::json& expected,
                 const std::string& what) {
  EXPECT_TRUE(bit_generator.state() == Halves(expected["state"])) << what;
  EXPECT_TRUE(bit_generator.increment() == Halves(expected["inc"])) << what;
  EXPECT_EQ(bit_generator.has_uint32(), expected["has_uint32"].get<int>() != 0)
      << what;
  // numpy keeps the last buffered half after using it; so does Pcg64.
  EXPECT_EQ(bit_generator.uinteger(), expected["uinteger"].get<uint32_t>())
      << what;
}

class NumpyVectorsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string out = TempPath("numpy_vectors.json");
    const absl::Status run = RunPython(
        RunfilePath("tests/engram_store/hashing/numpy_vectors.py"), {out});
    ASSERT_TRUE(run.ok()) << run;
    absl::StatusOr<std::string> text = ReadFile(out);
    ASSERT_TRUE(text.ok()) << text.status();
    vectors_ = new nlohmann::json(nlohmann::json::parse(
        *text, /*cb=*/nullptr, /*allow_exceptions=*/false));
    ASSERT_TRUE(vectors_->is_object());
  }
  static void TearDownTestSuite() {
    delete vectors_;
    vectors_ = nullptr;
  }

  static const nlohmann::json& Vectors() { return *vectors_; }

 private:
  static nlohmann::json* vectors_;
};

nlohmann::json* NumpyVectorsTest::vectors_ = nullptr;

TEST_F(NumpyVectorsTest, SeedSequencePoolAndStatesMatchNumpy) {
  ASSERT_GE(Vectors()["seed_sequences"].size(), 10u);
  for (const nlohmann::json& v : Vectors()["seed_sequences"]) {
    const std::vector<uint32_t> entropy = Words(v["entropy_words"]);
    const SeedSequence seq(entropy);
    const std::string what = v["entropy_words"].dump();
    EXPECT_EQ(std::vector<uint32_t>(seq.pool().begin(), seq.pool().end()),
              Words(v["pool"]))
        << what;
    EXPECT_EQ(seq.GenerateState32(v["state32"].size()), Words(v["state32"]))
        << what;
    EXPECT_EQ(seq.GenerateState64(v["state64"].size()),
              v["state64"].get<std::vector<uint64_t>>())
        << what;
  }
}

TEST_F(NumpyVectorsTest, Pcg64StateAndRawOutputsMatchNumpy) {
  for (const nlohmann::json& v : Vectors()["pcg64"]) {
    const std::string what = v["entropy_words"].dump();
    Pcg64 bit_generator(SeedSequence(Words(v["entropy_words"])));
    ExpectState(bit_generator, v["seeded"], what);
    std::vector<uint64_t> raw;
    for (size_t i = 0; i < v["raw"].size(); ++i) {
      raw.push_back(bit_generator.NextUint64());
    }
    EXPECT_EQ(raw, v["raw"].get<std::vector<uint64_t>>()) << what;
  }
}

TEST_F(NumpyVectorsTest, IntegersMatchNumpyForManySeedsAndRanges) {
  ASSERT_GE(Vectors()["integers"].size(), 300u);
  for (const nlohmann::json& v : Vectors()["integers"]) {
    const std::string what = v.dump().substr(0, 120);
    NumpyGenerator rng = NumpyGenerator::DefaultRng(v["seed"].get<uint64_t>());
    absl::StatusOr<std::vector<int64_t>> values =
        rng.Integers(v["low"].get<int64_t>(), v["high"].get<int64_t>(),
                     v["size"].get<size_t>());
    ASSERT_TRUE(values.ok()) << values.status() << what;
    EXPECT_EQ(*values, v["values"].get<std::vector<int64_t>>()) << what;
    // Same number of draws consumed (and 32-bit halves buffered) as numpy.
    ExpectState(rng.bit_generator(), v["after"], what);
  }
}

TEST_F(NumpyVectorsTest, BufferedHalfCarriesAcrossCalls) {
  for (const nlohmann::json& v : Vectors()["sequences"]) {
    const std::string what = v.dump().substr(0, 120);
    NumpyGenerator rng = NumpyGenerator::DefaultRng(v["seed"].get<uint64_t>());
    for (const nlohmann::json& call : v["calls"]) {
      absl::StatusOr<std::vector<int64_t>> values =
          rng.Integers(call["low"].get<int64_t>(), call["high"].get<int64_t>(),
                       call["size"].get<size_t>());
      ASSERT_TRUE(values.ok()) << values.status();
      EXPECT_EQ(*values, call["values"].get<std::vector<int64_t>>()) << what;
    }
    ExpectState(rng.bit_generator(), v["after"], what);
  }
}

// Fixed numbers (numpy 1.24) so the reproduction is pinned even where the
// script cannot run.
TEST(NumpyRandomTest, SeedSequenceOfLayerOneSeed) {
  const SeedSequence seq = SeedSequence::FromSeed(10007);
  EXPECT_EQ(std::vector<uint32_t>(seq.pool().begin(), seq.pool().end()),
            (std::vector<uint32_t>{4053860749u, 2814774274u, 4246066442u,
                                   62394930u}));
  EXPECT_EQ(
      seq.GenerateState64(4),
      (std::vector<uint64_t>{8634291315755388167ull, 11042498673593962405ull,
                             15418481100450270793ull, 9041516862649747678ull}));
}

TEST(NumpyRandomTest, FromSeedSplitsIntoLittleEndianWords) {
  const uint32_t words[] = {0x89abcdefu, 0x01234567u};
  EXPECT_EQ(SeedSequence::FromSeed(0x0123456789abcdefull).pool(),
            SeedSequence(words).pool());
  const uint32_t zero[] = {0};
  EXPECT_EQ(SeedSequence::FromSeed(0).pool(), SeedSequence(zero).pool());
}

TEST(NumpyRandomTest, EmptyRangeIsInvalidArgument) {
  NumpyGenerator rng = NumpyGenerator::DefaultRng(1);
  EXPECT_EQ(rng.Integers(5, 5, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rng.Integers(6, 5, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NumpyRandomTest, SingleValueRangeDrawsNothing) {
  NumpyGenerator rng = NumpyGenerator::DefaultRng(3);
  const unsigned __int128 before = rng.bit_generator().state();
  absl::StatusOr<std::vector<int64_t>> values = rng.Integers(-7, -6, 5);
  ASSERT_TRUE(values.ok());
  EXPECT_EQ(*values, std::vector<int64_t>(5, -7));
  EXPECT_TRUE(rng.bit_generator().state() == before);
}

}  // namespace
}  // namespace mneme::engram
