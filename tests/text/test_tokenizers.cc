#include "tests/text/test_tokenizers.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "text/tokenizer.h"

namespace mneme::text {

std::string TestdataPath(absl::string_view name) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir != nullptr ? srcdir : ".", "/",
                      workspace != nullptr ? workspace : "mneme",
                      "/tests/text/testdata/", name);
}

std::string ReadTestdata(absl::string_view name) {
  const std::string path = TestdataPath(name);
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTestTokenizer(
    absl::string_view name) {
  TokenizerOptions options;
  if (name == "deepseek_style") {
    options.tokenizer_config_path = TestdataPath("deepseek_style_config.json");
  }
  const std::string file = name == "synthetic"
                               ? std::string("synthetic_tokenizer.json")
                               : absl::StrCat(name, ".json");
  return Tokenizer::Create(TestdataPath(file), options);
}

}  // namespace mneme::text
