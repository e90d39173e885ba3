#ifndef MNEME_SERVICES_COORDINATOR_REQUEST_VALIDATOR_H_
#define MNEME_SERVICES_COORDINATOR_REQUEST_VALIDATOR_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "services/coordinator/generate_params.h"

namespace mneme::coordinator {

// The limits of a generation request, the same on every front (the gRPC
// Serving API, the HTTP front) and in the engine. This file is the one place
// that defines them.
inline constexpr size_t kMaxRequestIdBytes = 128;
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 1024;
inline constexpr size_t kMaxStopTokenIds = 64;
// A text prompt before tokenization (the HTTP front's body limit).
inline constexpr size_t kMaxPromptTextBytes = size_t{8} << 20;
// max_new_tokens when the client gives none.
inline constexpr int64_t kDefaultMaxNewTokens = 16;
inline constexpr int64_t kMinNewTokens = 1;
inline constexpr int64_t kMaxNewTokens = int64_t{1} << 24;
inline constexpr double kMaxTemperature = 1e4;
inline constexpr int64_t kMaxTopK = int64_t{1} << 24;
// Alternatives per position for top_logprobs and prompt_logprobs (OpenAI's
// and vLLM's limit).
inline constexpr int kMaxTopLogprobs = 20;

// How a front spells the fields it validates, so that an error names the
// field the client sent. Defaults: the Serving API's (proto) names.
struct RequestFieldNames {
  std::string request_id = "request_id";
  std::string prompt = "token_ids";
  std::string max_new_tokens = "max_new_tokens";
  std::string stop_token_ids = "stop_token_ids";
  std::string stop = "stop";
  std::string logprobs = "logprobs";
  std::string top_logprobs = "top_logprobs";
  std::string prompt_logprobs = "prompt_logprobs";
};

// Checks `params` (and the number of stop strings, which the fronts apply to
// the text) against the limits above (top_logprobs in [0, 20] and > 0 only
// with logprobs; prompt_logprobs -1 or in [0, 20]) and, when `model` is not
// null, against
// the served model: every token id in [0, vocab_size) (prompt ids also in
// [0, engram_vocab_size) when that is set), prompt +
// max_new_tokens within max_context_tokens. OK, or INVALID_ARGUMENT whose
// message starts with the field in quotes and which carries the field's
// name (see InvalidFieldName).
absl::Status ValidateGenerateRequest(const GenerateParams& params,
                                     size_t num_stop_strings,
                                     const ModelInfo* model,
                                     const RequestFieldNames& names = {});

// Checks the stop strings of a request (at most kMaxStopStrings, each at
// most kMaxStopStringBytes) before a front builds anything from them;
// INVALID_ARGUMENT naming `field` otherwise.
absl::Status ValidateStopStrings(absl::Span<const std::string> stops,
                                 absl::string_view field);

// INVALID_ARGUMENT "'<field>' <what>", carrying `field` for InvalidFieldName.
absl::Status InvalidFieldError(absl::string_view field, absl::string_view what);

// The field an InvalidFieldError names; empty for any other status.
std::string InvalidFieldName(const absl::Status& status);

}  // namespace mneme::coordinator

#endif  // MNEME_SERVICES_COORDINATOR_REQUEST_VALIDATOR_H_
