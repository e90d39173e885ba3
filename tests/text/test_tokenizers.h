#ifndef MNEME_TESTS_TEXT_TEST_TOKENIZERS_H_
#define MNEME_TESTS_TEXT_TEST_TOKENIZERS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "text/tokenizer.h"

namespace mneme::text {

// The path of a file of tests/text/testdata in the test's runfiles.
std::string TestdataPath(absl::string_view name);

// The contents of a file of tests/text/testdata (fails the test and returns
// "" if it cannot be read).
std::string ReadTestdata(absl::string_view name);

// The test tokenizers of tests/text/testdata: "synthetic" (the project's
// synthetic tokenizer), "deepseek_style" (DeepSeek's layout with the chat
// tokens, and its tokenizer_config.json), "gpt2_style", "llama3_style",
// "wordpiece_style".
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTestTokenizer(
    absl::string_view name);

}  // namespace mneme::text

#endif  // MNEME_TESTS_TEXT_TEST_TOKENIZERS_H_
