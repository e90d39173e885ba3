#include "services/coordinator/request_validator.h"

#include <optional>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"

namespace mneme::coordinator {
namespace {

// The status payload that names the offending field.
constexpr absl::string_view kFieldPayload = "type.mneme.dev/invalid_field";

absl::Status InRange(absl::string_view field, double value, double lo,
                     double hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();  // Not NaN.
  return InvalidFieldError(
      field, absl::StrCat("must be in [", lo, ", ", hi, "] (got ", value, ")"));
}

absl::Status IntInRange(absl::string_view field, int64_t value, int64_t lo,
                        int64_t hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return InvalidFieldError(
      field, absl::StrCat("must be in [", lo, ", ", hi, "] (got ", value, ")"));
}

absl::Status InVocabulary(absl::string_view field,
                          absl::Span<const int64_t> ids, int64_t vocab) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return InvalidFieldError(
          field, absl::StrCat("has ", ids[i], " at index ", i,
                              ", outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status InvalidFieldError(absl::string_view field,
                               absl::string_view what) {
  absl::Status st =
      absl::InvalidArgumentError(absl::StrCat("'", field, "' ", what));
  st.SetPayload(kFieldPayload, absl::Cord(field));
  return st;
}

std::string InvalidFieldName(const absl::Status& status) {
  const auto field = status.GetPayload(kFieldPayload);
  return field.has_value() ? static_cast<std::string>(*field) : std::string();
}

absl::Status ValidateStopStrings(absl::Span<const std::string> stops,
                                 absl::string_view field) {
  if (stops.size() > kMaxStopStrings) {
    return InvalidFieldError(
        field, absl::StrCat("has ", stops.size(), " strings, more than ",
                            kMaxStopStrings));
  }
  for (size_t i = 0; i < stops.size(); ++i) {
    if (stops[i].size() > kMaxStopStringBytes) {
      return InvalidFieldError(
          field,
          absl::StrCat("has a string of ", stops[i].size(), " bytes at index ",
                       i, ", more than ", kMaxStopStringBytes));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateGenerateRequest(const GenerateParams& p,
                                     size_t num_stop_strings,
                                     const ModelInfo* model,
                                     const RequestFieldNames& names) {
  if (p.request_id.size() > kMaxRequestIdBytes) {
    return InvalidFieldError(
        names.request_id,
        absl::StrCat("is ", p.request_id.size(), " bytes, more than ",
                     kMaxRequestIdBytes));
  }
  if (p.prompt.empty()) return InvalidFieldError(names.prompt, "is empty");
  RETURN_IF_ERROR(IntInRange(names.max_new_tokens, p.max_new_tokens,
                             kMinNewTokens, kMaxNewTokens));
  const worker::v1::SamplingParams& s = p.sampling;
  RETURN_IF_ERROR(InRange("temperature", s.temperature(), 0, kMaxTemperature));
  RETURN_IF_ERROR(InRange("top_p", s.top_p(), 0, 1));
  RETURN_IF_ERROR(IntInRange("top_k", s.top_k(), 0, kMaxTopK));
  RETURN_IF_ERROR(InRange("min_p", s.min_p(), 0, 1));
  RETURN_IF_ERROR(
      IntInRange(names.top_logprobs, p.top_logprobs, 0, kMaxTopLogprobs));
  if (p.top_logprobs > 0 && !p.logprobs) {
    return InvalidFieldError(
        names.top_logprobs,
        absl::StrCat("needs '", names.logprobs, "' to be set"));
  }
  if (p.prompt_logprobs != -1) {
    RETURN_IF_ERROR(IntInRange(names.prompt_logprobs, p.prompt_logprobs, 0,
                               kMaxTopLogprobs));
  }
  if (p.stop_token_ids.size() > kMaxStopTokenIds) {
    return InvalidFieldError(
        names.stop_token_ids,
        absl::StrCat("has ", p.stop_token_ids.size(), " ids, more than ",
                     kMaxStopTokenIds));
  }
  if (num_stop_strings > kMaxStopStrings) {
    return InvalidFieldError(
        names.stop, absl::StrCat("has ", num_stop_strings,
                                 " strings, more than ", kMaxStopStrings));
  }
  if (model == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(InVocabulary(names.prompt, p.prompt, model->vocab_size));
  if (model->engram_vocab_size > 0 &&
      model->engram_vocab_size < model->vocab_size) {
    // The checkpoint pads vocab_size past its tokenizer; the Engram hashing
    // (like the reference's table lookup) has no compressed id for the
    // padding ids.
    for (size_t i = 0; i < p.prompt.size(); ++i) {
      if (p.prompt[i] >= model->engram_vocab_size) {
        return InvalidFieldError(
            names.prompt,
            absl::StrCat("has ", p.prompt[i], " at index ", i,
                         ", outside the tokenizer's vocabulary [0, ",
                         model->engram_vocab_size,
                         ") that the model's Engram layers map"));
      }
    }
  }
  RETURN_IF_ERROR(
      InVocabulary(names.stop_token_ids, p.stop_token_ids, model->vocab_size));
  const int64_t total =
      static_cast<int64_t>(p.prompt.size()) + p.max_new_tokens;
  if (total > model->max_context_tokens) {
    return InvalidFieldError(
        names.prompt, absl::StrCat("(", p.prompt.size(), " tokens) + ",
                                   names.max_new_tokens, " (", p.max_new_tokens,
                                   ") exceeds the maximum context of ",
                                   model->max_context_tokens, " tokens"));
  }
  return absl::OkStatus();
}

}  // namespace mneme::coordinator
