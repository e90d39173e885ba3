// Runs the fuzz entry point over the committed seed corpus in the normal
// (gcc) build, and checks that each seed is accepted or rejected as its name
// says (valid_* parse, bad_* are DataLoss).
#include <dirent.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors_header.h"
#include "gtest/gtest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace mneme::engram {
namespace {

std::string CorpusDir() {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* workspace = getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir != nullptr ? srcdir : ".", "/",
                      workspace != nullptr ? workspace : "mneme",
                      "/tests/fuzz/corpus/safetensors_header");
}

std::vector<std::string> ListCorpus() {
  std::vector<std::string> names;
  DIR* dir = opendir(CorpusDir().c_str());
  if (dir == nullptr) return names;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(dir);
  return names;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(SafetensorsHeaderCorpusTest, SeedsBehaveAsNamed) {
  const std::vector<std::string> names = ListCorpus();
  ASSERT_GE(names.size(), 10u) << "corpus missing at " << CorpusDir();
  int valid = 0;
  int bad = 0;
  for (const std::string& name : names) {
    const std::string bytes = ReadFile(CorpusDir() + "/" + name);
    EXPECT_EQ(LLVMFuzzerTestOneInput(
                  reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
              0);
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
    EXPECT_EQ(LLVMFuzzerTestOneInput(
                  reinterpret_cast<const uint8_t*>(input.data()), input.size()),
              0);
  }
}

}  // namespace
}  // namespace mneme::engram
