// Runs a fuzz entry point (LLVMFuzzerTestOneInput, linked in) in the normal
// build over its committed seed corpus - the directory FUZZ_CORPUS names,
// relative to the runfiles root - and over inputs that overflowed the stack
// before depth limits existed. A seed that crashes or violates an invariant
// of the target (the targets abort on those) fails the test.
#include "tests/fuzz/fuzz_corpus.h"

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace mneme::fuzz {
namespace {

std::string CorpusDir() {
  const char* corpus = getenv("FUZZ_CORPUS");
  return fuzz::CorpusDir(corpus != nullptr ? corpus : "");
}

TEST(FuzzCorpusTest, SeedsRunCleanly) {
  ASSERT_NE(getenv("FUZZ_CORPUS"), nullptr);
  const std::vector<std::string> names = ListCorpus(CorpusDir());
  ASSERT_GE(names.size(), 4u) << "corpus missing at " << CorpusDir();
  int deep = 0;
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(RunFuzzInput(ReadCorpusFile(CorpusDir() + "/" + name)), 0);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5))
        << "seed " << name << " is slow";
    if (name.rfind("deep_", 0) == 0) ++deep;
  }
  EXPECT_GT(deep, 0) << "no deep_* seed (nesting past the depth limits)";
}

TEST(FuzzCorpusTest, DeepAndDegenerateInputsDoNotCrash) {
  const std::string arrays = std::string(100000, '[');
  const std::vector<std::string> inputs = {
      "",
      "\n",
      std::string(1, '\0'),
      arrays,
      std::string(100000, '{'),
      arrays + std::string(100000, ']'),
      absl::StrCat(R"({"a":)", arrays, std::string(100000, ']'), "}"),
      absl::StrCat(R"({"type": "Sequence", "normalizers": )", arrays),
  };
  for (const std::string& input : inputs) {
    EXPECT_EQ(RunFuzzInput(input), 0) << input.substr(0, 40);
  }
}

}  // namespace
}  // namespace mneme::fuzz
