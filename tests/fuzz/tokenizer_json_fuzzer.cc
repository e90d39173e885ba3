// libFuzzer target for tokenizer files: the input as a tokenizer.json
// (text::Tokenizer::FromJson) and as the tokenizer_config.json of a small
// valid tokenizer. A file must be accepted or refused with a status that
// names it - never a crash - and a tokenizer built from it must encode and
// decode a few strings.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "text/tokenizer.h"

namespace {

using ::mneme::text::Tokenizer;
using ::mneme::text::TokenizerOptions;

constexpr char kFileName[] = "fuzz/tokenizer.json";

// A small byte-level tokenizer, the base of the tokenizer_config.json runs.
constexpr char kSmallTokenizer[] = R"json({
  "added_tokens": [{"id": 0, "content": "<s>", "special": true,
                    "single_word": false, "lstrip": false, "rstrip": false,
                    "normalized": false}],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false},
  "post_processor": null,
  "decoder": {"type": "ByteLevel"},
  "model": {"type": "BPE", "vocab": {"<s>": 0, "a": 1, "b": 2, "ab": 3},
            "merges": ["a b"]}
})json";

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "invariant violated: %s\n", what);
  std::abort();
}

void CheckRefusal(const absl::Status& status, absl::string_view name) {
  if (status.ok()) return;
  if (status.message().find(name) == absl::string_view::npos) {
    Fail("refusal does not name the file");
  }
}

void Exercise(const Tokenizer& tokenizer) {
  for (const absl::string_view text : {"ab ba", "<s>a\xc3\xa9", ""}) {
    absl::StatusOr<std::vector<int64_t>> ids =
        tokenizer.Encode(text, mneme::text::AddSpecialTokens::kYes);
    if (!ids.ok()) continue;
    (void)tokenizer.Decode(*ids, mneme::text::SkipSpecialTokens::kNo);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromJson(input, {}, kFileName);
  CheckRefusal(tokenizer.status(), kFileName);
  if (tokenizer.ok()) Exercise(**tokenizer);

  TokenizerOptions options;
  options.tokenizer_config_json = std::string(input);
  absl::StatusOr<std::unique_ptr<Tokenizer>> with_config =
      Tokenizer::FromJson(kSmallTokenizer, options, "small.json");
  CheckRefusal(with_config.status(), "tokenizer_config.json");
  if (with_config.ok()) Exercise(**with_config);
  return 0;
}
