#include "services/coordinator/request_validator.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mneme::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

GenerateParams Valid() {
  GenerateParams p;
  p.prompt = {5, 6};
  p.max_new_tokens = 4;
  p.sampling.set_top_p(1);
  return p;
}

ModelInfo Model() {
  ModelInfo m;
  m.vocab_size = 100;
  m.max_context_tokens = 10;
  return m;
}

TEST(RequestValidatorTest, AcceptsTheLimits) {
  const ModelInfo model = Model();
  GenerateParams p = Valid();
  EXPECT_TRUE(ValidateGenerateRequest(p, 0, &model).ok());
  p.prompt = {0, 99};
  p.max_new_tokens = 8;  // Exactly the context.
  p.request_id = std::string(kMaxRequestIdBytes, 'x');
  p.sampling.set_temperature(kMaxTemperature);
  p.sampling.set_top_k(kMaxTopK);
  p.sampling.set_min_p(1);
  p.stop_token_ids = {0, 99};
  EXPECT_TRUE(ValidateGenerateRequest(p, kMaxStopStrings, &model).ok());
  // Without the model, only the model-free limits.
  p.max_new_tokens = kMaxNewTokens;
  p.prompt = {1000};
  EXPECT_TRUE(ValidateGenerateRequest(p, 0, nullptr).ok());
}

TEST(RequestValidatorTest, NamesTheFieldAsTheFrontSpellsIt) {
  const ModelInfo model = Model();
  RequestFieldNames http;
  http.prompt = "prompt";
  http.max_new_tokens = "max_tokens";
  GenerateParams p = Valid();
  p.max_new_tokens = 0;
  absl::Status st = ValidateGenerateRequest(p, 0, &model, http);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()),
              StartsWith("'max_tokens' must be in [1, "));
  EXPECT_EQ(InvalidFieldName(st), "max_tokens");
  st = ValidateGenerateRequest(p, 0, &model);
  EXPECT_EQ(InvalidFieldName(st), "max_new_tokens");

  p = Valid();
  p.max_new_tokens = 9;  // 2 + 9 > 10.
  st = ValidateGenerateRequest(p, 0, &model, http);
  EXPECT_EQ(InvalidFieldName(st), "prompt");
  EXPECT_THAT(std::string(st.message()), HasSubstr("max_tokens (9)"));
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("maximum context of 10 tokens"));

  p = Valid();
  p.prompt = {5, 100};
  st = ValidateGenerateRequest(p, 0, &model, http);
  EXPECT_EQ(InvalidFieldName(st), "prompt");
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("outside the vocabulary [0, 100)"));

  EXPECT_EQ(InvalidFieldName(
                ValidateGenerateRequest(Valid(), kMaxStopStrings + 1, &model)),
            "stop");
}

// Checkpoints pad vocab_size past the tokenizer; the Engram hashing has no
// compressed id for the padding ids, so the prompt must not hold them.
TEST(RequestValidatorTest, RefusesPromptIdsOutsideTheEngramVocabulary) {
  ModelInfo model = Model();
  model.engram_vocab_size = 90;
  GenerateParams p = Valid();
  p.prompt = {5, 89};
  EXPECT_TRUE(ValidateGenerateRequest(p, 0, &model).ok());
  p.prompt = {5, 90};
  absl::Status st = ValidateGenerateRequest(p, 0, &model);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InvalidFieldName(st), "token_ids");
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("has 90 at index 1, outside the tokenizer's "
                        "vocabulary [0, 90)"));
  // Stop ids never reach the Engram layers: the model's vocabulary bounds
  // them.
  p.prompt = {5};
  p.stop_token_ids = {95};
  EXPECT_TRUE(ValidateGenerateRequest(p, 0, &model).ok());
  // Without Engram layers (0), only vocab_size applies.
  model.engram_vocab_size = 0;
  p.prompt = {99};
  EXPECT_TRUE(ValidateGenerateRequest(p, 0, &model).ok());
}

TEST(RequestValidatorTest, RefusesEachField) {
  const ModelInfo model = Model();
  struct Case {
    void (*mutate)(GenerateParams&);
    const char* field;
  };
  const Case cases[] = {
      {[](GenerateParams& p) { p.prompt.clear(); }, "token_ids"},
      {[](GenerateParams& p) { p.prompt = {-1}; }, "token_ids"},
      {[](GenerateParams& p) { p.max_new_tokens = -1; }, "max_new_tokens"},
      {[](GenerateParams& p) { p.max_new_tokens = kMaxNewTokens + 1; },
       "max_new_tokens"},
      {[](GenerateParams& p) { p.stop_token_ids = {100}; }, "stop_token_ids"},
      {[](GenerateParams& p) {
         p.stop_token_ids.assign(kMaxStopTokenIds + 1, 1);
       },
       "stop_token_ids"},
      {[](GenerateParams& p) {
         p.request_id.assign(kMaxRequestIdBytes + 1, 'x');
       },
       "request_id"},
      {[](GenerateParams& p) { p.sampling.set_temperature(-0.1f); },
       "temperature"},
      {[](GenerateParams& p) { p.sampling.set_temperature(2e4f); },
       "temperature"},
      {[](GenerateParams& p) { p.sampling.set_top_p(1.1f); }, "top_p"},
      {[](GenerateParams& p) { p.sampling.set_top_p(-1); }, "top_p"},
      {[](GenerateParams& p) { p.sampling.set_top_k(-1); }, "top_k"},
      {[](GenerateParams& p) { p.sampling.set_top_k(kMaxTopK + 1); }, "top_k"},
      {[](GenerateParams& p) { p.sampling.set_min_p(1.5f); }, "min_p"},
  };
  for (const Case& c : cases) {
    GenerateParams p = Valid();
    c.mutate(p);
    const absl::Status st = ValidateGenerateRequest(p, 0, &model);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(InvalidFieldName(st), c.field) << st;
    EXPECT_THAT(std::string(st.message()),
                StartsWith(std::string("'") + c.field + "'"));
  }
  EXPECT_EQ(InvalidFieldName(absl::InvalidArgumentError("plain")), "");
}

TEST(RequestValidatorTest, StopStringsAreBoundedInCountAndBytes) {
  std::vector<std::string> stops(kMaxStopStrings, "x");
  stops.back().assign(kMaxStopStringBytes, 'y');
  EXPECT_TRUE(ValidateStopStrings(stops, "stop").ok());
  stops.back().push_back('y');
  absl::Status st = ValidateStopStrings(stops, "stop");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InvalidFieldName(st), "stop");
  EXPECT_THAT(std::string(st.message()),
              HasSubstr(absl::StrCat("index ", kMaxStopStrings - 1)));
  stops.back() = "y";
  stops.emplace_back("z");
  st = ValidateStopStrings(stops, "stop");
  EXPECT_EQ(InvalidFieldName(st), "stop");
  EXPECT_THAT(std::string(st.message()), HasSubstr("more than 16"));
}

TEST(RequestValidatorTest, LogprobCountsAreBounded) {
  const ModelInfo model = Model();
  GenerateParams p = Valid();
  EXPECT_EQ(p.top_logprobs, 0);
  EXPECT_EQ(p.prompt_logprobs, -1);
  p.logprobs = true;
  p.top_logprobs = kMaxTopLogprobs;
  p.prompt_logprobs = kMaxTopLogprobs;
  EXPECT_TRUE(ValidateGenerateRequest(p, 0, &model).ok());
  p.top_logprobs = 0;
  p.prompt_logprobs = 0;
  EXPECT_TRUE(ValidateGenerateRequest(p, 0, &model).ok());

  auto refused = [&](const GenerateParams& q, const std::string& field,
                     const std::string& what) {
    const absl::Status st = ValidateGenerateRequest(q, 0, &model);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_EQ(InvalidFieldName(st), field);
    EXPECT_THAT(std::string(st.message()), HasSubstr(what));
  };
  GenerateParams q = p;
  q.top_logprobs = kMaxTopLogprobs + 1;
  refused(q, "top_logprobs", "must be in [0, 20]");
  q.top_logprobs = -1;
  refused(q, "top_logprobs", "must be in [0, 20]");
  q = p;
  q.logprobs = false;
  q.top_logprobs = 1;
  refused(q, "top_logprobs", "needs 'logprobs'");
  q = p;
  q.prompt_logprobs = kMaxTopLogprobs + 1;
  refused(q, "prompt_logprobs", "must be in [0, 20]");
  q.prompt_logprobs = -2;
  refused(q, "prompt_logprobs", "must be in [0, 20]");
  // The HTTP front's spelling.
  RequestFieldNames http;
  http.top_logprobs = "logprobs";
  q = p;
  q.top_logprobs = 21;
  EXPECT_EQ(InvalidFieldName(ValidateGenerateRequest(q, 0, &model, http)),
            "logprobs");
}

}  // namespace
}  // namespace mneme::coordinator
