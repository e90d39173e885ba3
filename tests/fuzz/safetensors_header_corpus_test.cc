// Runs the fuzz entry point over the committed seed corpus in the normal
// (gcc) build, and checks that each seed is accepted or rejected as its name
// says (valid_* parse, bad_* are DataLoss).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors_header.h"
#include "gtest/gtest.h"
#include "tests/fuzz/fuzz_corpus.h"

namespace mneme::fuzz {
namespace {

std::string CorpusDir() {
  return fuzz::CorpusDir("tests/fuzz/corpus/safetensors_header");
}

TEST(SafetensorsHeaderCorpusTest, SeedsBehaveAsNamed) {
  const std::vector<std::string> names = ListCorpus(CorpusDir());
  ASSERT_GE(names.size(), 10u) << "corpus missing at " << CorpusDir();
  int valid = 0;
  int bad = 0;
  for (const std::string& name : names) {
    const std::string bytes = ReadCorpusFile(CorpusDir() + "/" + name);
    EXPECT_EQ(RunFuzzInput(bytes), 0);
    absl::StatusOr<checkpoint::SafetensorsHeader> header =
        checkpoint::ParseSafetensorsBuffer(bytes, name);
    if (absl::StartsWith(name, "valid_")) {
      ++valid;
      EXPECT_TRUE(header.ok()) << name << ": " << header.status();
    } else if (absl::StartsWith(name, "bad_")) {
      ++bad;
      EXPECT_EQ(header.status().code(), absl::StatusCode::kDataLoss) << name;
      EXPECT_TRUE(absl::StrContains(header.status().message(), name)) << name;
    } else {
      ADD_FAILURE() << "seed " << name << " is neither valid_* nor bad_*";
    }
  }
  EXPECT_GT(valid, 0);
  EXPECT_GT(bad, 0);
}

TEST(SafetensorsHeaderCorpusTest, EdgeInputsDoNotCrash) {
  const std::vector<std::string> inputs = {
      "",
      std::string(7, '\xff'),
      std::string(8, '\0'),
      std::string("\x02\0\0\0\0\0\0\0{}", 10),
      std::string("\x08\0\0\0\0\0\0\0{\"a\":{}}", 16),
      std::string(1000, '['),
      std::string(1000, '{'),
  };
  for (const std::string& input : inputs) {
    EXPECT_EQ(RunFuzzInput(input), 0);
  }
}

}  // namespace
}  // namespace mneme::fuzz
