// Row ids against tests/engram_store/hashing/reference_row_ids.py, an
// independent numpy implementation of the model's definition, on thousands of
// random token sequences for small synthetic configs and the V4.1 numbers.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/engram_config.h"
#include "engram_store/hashing/compressed_vocabulary.h"
#include "engram_store/hashing/ngram_hasher.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engram_store/hashing/python_runner.h"

namespace mneme::engram {
namespace {

using ::mneme::engram::testing::ReadFile;
using ::mneme::engram::testing::RunfilePath;
using ::mneme::engram::testing::RunPython;
using ::mneme::engram::testing::TempPath;
using ::mneme::engram::testing::WriteFile;

struct Scenario {
  std::string name;
  std::vector<int> layer_ids;
  int max_ngram_size;
  int n_heads;
  int64_t vocab_size;
  int64_t compressed_vocab_size;
  int64_t num_tokens;
  int64_t pad_token_id;
  int num_sequences;
  int max_length;
};

void PrintTo(const Scenario& scenario, std::ostream* os) {
  *os << scenario.name;
}

// A random surjective token -> compressed id table, numbered by first
// occurrence like the reference's.
std::vector<int64_t> RandomLookup(int64_t num_tokens, int64_t compressed,
                                  std::mt19937_64& rng) {
  std::vector<int64_t> raw(num_tokens);
  for (int64_t t = 0; t < num_tokens; ++t) {
    raw[t] = t < compressed ? t : static_cast<int64_t>(rng() % compressed);
  }
  std::shuffle(raw.begin(), raw.end(), rng);
  std::vector<int64_t> renumber(compressed, -1);
  int64_t next = 0;
  for (int64_t& id : raw) {
    if (renumber[id] < 0) renumber[id] = next++;
    id = renumber[id];
  }
  return raw;
}

// Random sequences with repeats, pad tokens and very short ones, so that
// repeated n-grams, sequence starts and the pad rule are all exercised.
std::vector<std::vector<int64_t>> RandomSequences(const Scenario& s,
                                                  std::mt19937_64& rng) {
  std::vector<std::vector<int64_t>> sequences;
  for (int i = 0; i < s.num_sequences; ++i) {
    const int length = 1 + static_cast<int>(rng() % s.max_length);
    std::vector<int64_t> seq;
    for (int t = 0; t < length; ++t) {
      const uint64_t kind = rng() % 10;
      if (kind == 0 || i % 97 == 0) {
        seq.push_back(s.pad_token_id);
      } else if (kind == 1 && !seq.empty()) {
        seq.push_back(seq[rng() % seq.size()]);
      } else if (kind == 2) {
        seq.push_back(s.num_tokens - 1 - static_cast<int64_t>(rng() % 3));
      } else {
        seq.push_back(static_cast<int64_t>(rng() % s.num_tokens));
      }
    }
    sequences.push_back(std::move(seq));
  }
  return sequences;
}

class ReferenceRowIdsTest : public ::testing::TestWithParam<Scenario> {};

TEST_P(ReferenceRowIdsTest, MatchesIndependentNumpyReference) {
  const Scenario& s = GetParam();
  std::mt19937_64 rng(0x5eed + s.num_tokens);
  const std::vector<int64_t> lookup =
      RandomLookup(s.num_tokens, s.compressed_vocab_size, rng);
  const std::vector<std::vector<int64_t>> sequences = RandomSequences(s, rng);

  nlohmann::json spec;
  spec["config"] = {{"layer_ids", s.layer_ids},
                    {"max_ngram_size", s.max_ngram_size},
                    {"n_heads", s.n_heads},
                    {"vocab_size", s.vocab_size},
                    {"compressed_vocab_size", s.compressed_vocab_size},
                    {"pad_token_id", s.pad_token_id}};
  spec["lookup"] = lookup;
  spec["sequences"] = sequences;
  const std::string in = TempPath(s.name + "_in.json");
  const std::string meta_path = TempPath(s.name + "_meta.json");
  const std::string rows_path = TempPath(s.name + "_rows.bin");
  ASSERT_TRUE(WriteFile(in, spec.dump()).ok());
  const absl::Status run =
      RunPython(RunfilePath("tests/engram_store/hashing/reference_row_ids.py"),
                {in, meta_path, rows_path});
  ASSERT_TRUE(run.ok()) << run;
  absl::StatusOr<std::string> meta_text = ReadFile(meta_path);
  absl::StatusOr<std::string> rows_bytes = ReadFile(rows_path);
  ASSERT_TRUE(meta_text.ok() && rows_bytes.ok());
  const nlohmann::json meta = nlohmann::json::parse(*meta_text, /*cb=*/nullptr,
                                                    /*allow_exceptions=*/false);
  ASSERT_TRUE(meta.is_object());
  std::vector<int64_t> expected_rows(rows_bytes->size() / sizeof(int64_t));
  std::memcpy(expected_rows.data(), rows_bytes->data(),
              expected_rows.size() * sizeof(int64_t));

  checkpoint::EngramConfig config;
  config.layer_ids = s.layer_ids;
  for (const nlohmann::json& layer : meta["layers"]) {
    config.num_embeddings.push_back(layer["num_rows"].get<int64_t>());
  }
  config.max_ngram_size = s.max_ngram_size;
  config.n_heads = s.n_heads;
  config.vocab_size = s.vocab_size;
  config.compressed_vocab_size = s.compressed_vocab_size;
  config.pad_token_id = s.pad_token_id;
  absl::StatusOr<std::unique_ptr<CompressedVocabulary>> vocabulary =
      CompressedVocabulary::FromLookupTable(lookup);
  ASSERT_TRUE(vocabulary.ok()) << vocabulary.status();
  absl::StatusOr<std::unique_ptr<NgramHasher>> hasher =
      NgramHasher::Create(config, *std::move(vocabulary));
  ASSERT_TRUE(hasher.ok()) << hasher.status();
  const int columns = (*hasher)->num_columns();

  // Constants.
  for (size_t i = 0; i < s.layer_ids.size(); ++i) {
    const LayerHashLayout& layer = (*hasher)->layout().layers()[i];
    EXPECT_EQ(layer.multipliers,
              meta["layers"][i]["multipliers"].get<std::vector<int64_t>>());
    EXPECT_EQ(layer.primes,
              meta["layers"][i]["primes"].get<std::vector<int64_t>>());
    EXPECT_EQ(layer.offsets,
              meta["layers"][i]["offsets"].get<std::vector<int64_t>>());
  }

  // Row ids: whole sequences, chunks with context, and column subsets.
  size_t total_positions = 0;
  for (const auto& seq : sequences) total_positions += seq.size();
  ASSERT_EQ(expected_rows.size(),
            s.layer_ids.size() * total_positions * columns);
  size_t cursor = 0;
  int mismatches = 0;
  for (int layer_id : s.layer_ids) {
    for (const std::vector<int64_t>& seq : sequences) {
      const std::vector<int64_t> expected(
          expected_rows.begin() + cursor,
          expected_rows.begin() + cursor + seq.size() * columns);
      cursor += seq.size() * columns;

      absl::StatusOr<std::vector<int64_t>> whole =
          (*hasher)->RowIds(layer_id, {}, seq);
      ASSERT_TRUE(whole.ok()) << whole.status();
      if (*whole != expected && ++mismatches <= 5) {
        ADD_FAILURE() << "layer " << layer_id << " sequence of " << seq.size()
                      << " tokens differs from the reference";
      }

      // The same sequence in random chunks, each given the tokens before it
      // (sometimes all of them, sometimes only the needed tail).
      std::vector<int64_t> chunked;
      size_t start = 0;
      while (start < seq.size()) {
        const size_t length = 1 + rng() % 7;
        const size_t end = std::min(seq.size(), start + length);
        const size_t context_begin =
            rng() % 2 == 0
                ? 0
                : start - std::min<size_t>(start, (*hasher)->context_size());
        const std::span<const int64_t> context(seq.data() + context_begin,
                                               start - context_begin);
        const std::span<const int64_t> chunk(seq.data() + start, end - start);
        absl::StatusOr<std::vector<int64_t>> part =
            (*hasher)->RowIds(layer_id, context, chunk);
        ASSERT_TRUE(part.ok()) << part.status();
        chunked.insert(chunked.end(), part->begin(), part->end());
        start = end;
      }
      EXPECT_EQ(chunked, expected);

      // A random subset of columns in random order.
      std::vector<int> subset(columns);
      for (int c = 0; c < columns; ++c) subset[c] = c;
      std::shuffle(subset.begin(), subset.end(), rng);
      subset.resize(1 + rng() % columns);
      std::vector<int64_t> some(seq.size() * subset.size());
      ASSERT_TRUE(
          (*hasher)->ComputeColumnRowIds(layer_id, {}, seq, subset, some).ok());
      for (size_t t = 0; t < seq.size(); ++t) {
        for (size_t i = 0; i < subset.size(); ++i) {
          ASSERT_EQ(some[t * subset.size() + i],
                    expected[t * columns + subset[i]]);
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, ReferenceRowIdsTest,
    ::testing::Values(
        // Small primes (1009, 1013, ...), three layers including layer 0
        // (seed 0).
        Scenario{"small_three_layers",
                 {0, 3, 7},
                 3,
                 4,
                 1000,
                 700,
                 1000,
                 5,
                 2000,
                 40},
        // Long n-grams, tiny primes from 53 on, pad token 0.
        Scenario{"order5_tiny_primes", {2, 5}, 5, 3, 50, 300, 400, 0, 1000, 24},
        // DeepSeek-V4.1-Flash: layers 1 and 14, 24 columns, 16M-row primes,
        // 99,092 compressed ids, a 129,280-token vocabulary.
        Scenario{"v41", {1, 14}, 4, 8, 16000000, 99092, 129280, 2, 1000, 48}),
    [](const ::testing::TestParamInfo<Scenario>& info) {
      return info.param.name;
    });

}  // namespace
}  // namespace mneme::engram
