// `mneme run` and `mneme score` through their library entry points: the
// JSON contract, chunked prefill = whole prefill, seeded sampling, the
// quality gate on identical and on different checkpoints, bad input.

#include "tools/cli/run_command.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "nlohmann/json.hpp"
#include "services/worker/local_model.h"
#include "tools/synthetic/release_checkpoint.h"

namespace mneme::cli {
namespace {

using ::testing::HasSubstr;

const std::string& Checkpoint(int seed) {
  static std::map<int, std::string>* dirs = new std::map<int, std::string>();
  if (auto it = dirs->find(seed); it != dirs->end()) return it->second;
  synthetic::ReleaseCheckpointOptions o;
  o.threads = 1;
  o.out_dir = absl::StrCat(getenv("TEST_TMPDIR"), "/tiny", seed);
  o.seed = seed;
  const absl::Status st = synthetic::MakeReleaseCheckpoint(o);
  EXPECT_TRUE(st.ok()) << st;
  return (*dirs)[seed] = o.out_dir;
}

absl::StatusOr<nlohmann::json> Json(
    absl::Status (*command)(const std::vector<std::string>&, std::ostream&),
    const std::vector<std::string>& argv) {
  std::ostringstream out;
  if (absl::Status st = command(argv, out); !st.ok()) return st;
  return nlohmann::json::parse(out.str());
}

const char kPrompt[] = "5,9,200,31,7,7,7,400,12,13,14,15,16,17,18,19,20,21,22";

TEST(RunCommandTest, JsonContractAndChunkedPrefill) {
  const std::string ckpt = "--checkpoint=" + Checkpoint(1);
  absl::StatusOr<nlohmann::json> whole =
      Json(RunRun, {ckpt, absl::StrCat("--tokens=", kPrompt),
                    "--max-new-tokens=6", "--threads=1", "--json"});
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_TRUE((*whole)["token_ids"].is_array());
  EXPECT_EQ((*whole)["token_ids"].size(), 6u);
  EXPECT_EQ((*whole)["finish_reason"], "length");
  EXPECT_EQ((*whole)["prompt_tokens"], 19);
  for (const auto& lp : (*whole)["logprobs"]) EXPECT_LE(lp.get<double>(), 0);
  // The weights' checkpoint bytes, and what loading them made resident (the
  // allocator may reuse pages freed before, so no bound here).
  ASSERT_TRUE((*whole)["weight_bytes"].is_number_integer());
  EXPECT_GT((*whole)["weight_bytes"].get<int64_t>(), 0);
  EXPECT_TRUE((*whole)["weight_resident_bytes"].is_number_integer());
  absl::StatusOr<nlohmann::json> chunked = Json(
      RunRun, {ckpt, absl::StrCat("--tokens=", kPrompt), "--max-new-tokens=6",
               "--chunk-tokens=4", "--threads=1", "--json"});
  ASSERT_TRUE(chunked.ok()) << chunked.status();
  EXPECT_EQ((*chunked)["token_ids"], (*whole)["token_ids"]);
}

// log_softmax of every position of `tokens` in one chunk, in double, from
// the model's logits (independent of the command's code).
std::vector<std::vector<double>> ReferenceLogSoftmax(
    const std::string& dir, const std::vector<int64_t>& tokens) {
  worker::LocalModelOptions o;
  o.checkpoint_dir = dir;
  o.threads = 1;
  absl::StatusOr<std::unique_ptr<worker::LocalModel>> local =
      worker::LocalModel::Create(o);
  EXPECT_TRUE(local.ok()) << local.status();
  if (!local.ok()) return {};
  model::StepInput in;
  model::SequenceChunk c;
  c.sequence_id = 1;
  c.tokens = tokens;
  c.logits = model::SequenceChunk::Logits::kAll;
  in.chunks.push_back(c);
  absl::StatusOr<model::StepOutput> out = (*local)->model().Step(in);
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return {};
  const int64_t v = (*local)->model().dims().vocab_size;
  std::vector<std::vector<double>> rows;
  for (size_t p = 0; p < tokens.size(); ++p) {
    const float* row = out->logits[0].data() + p * v;
    const double max = *std::max_element(row, row + v);
    double sum = 0;
    for (int64_t i = 0; i < v; ++i) sum += std::exp(row[i] - max);
    std::vector<double> lp(v);
    for (int64_t i = 0; i < v; ++i) lp[i] = row[i] - max - std::log(sum);
    rows.push_back(std::move(lp));
  }
  return rows;
}

TEST(RunCommandTest, PromptLogprobs) {
  const std::vector<int64_t> prompt = {5,  9,  200, 31, 7,  7,  7,  400, 12, 13,
                                       14, 15, 16,  17, 18, 19, 20, 21,  22};
  const std::string ckpt = "--checkpoint=" + Checkpoint(1);
  absl::StatusOr<nlohmann::json> whole = Json(
      RunRun, {ckpt, absl::StrCat("--tokens=", kPrompt), "--max-new-tokens=2",
               "--prompt-logprobs", "--logprobs=3", "--threads=1", "--json"});
  ASSERT_TRUE(whole.ok()) << whole.status();
  // One number per prompt position, null for the first; the top N apart.
  const nlohmann::json& pl = (*whole)["prompt_logprobs"];
  const nlohmann::json& ptop = (*whole)["prompt_top_logprobs"];
  ASSERT_EQ(pl.size(), prompt.size());
  ASSERT_EQ(ptop.size(), prompt.size());
  EXPECT_TRUE(pl[0].is_null());
  EXPECT_TRUE(ptop[0].is_null());
  const std::vector<std::vector<double>> ref =
      ReferenceLogSoftmax(Checkpoint(1), prompt);
  ASSERT_EQ(ref.size(), prompt.size());
  for (size_t i = 1; i < prompt.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("prompt token ", i));
    const std::vector<double>& row = ref[i - 1];
    ASSERT_TRUE(pl[i].is_number());
    EXPECT_NEAR(pl[i].get<double>(), row[prompt[i]], 1e-4);
    const nlohmann::json& top = ptop[i];
    ASSERT_EQ(top.size(), 3u);
    EXPECT_EQ(top[0]["token_id"].get<int64_t>(),
              std::max_element(row.begin(), row.end()) - row.begin());
    for (const auto& t : top) {
      EXPECT_NEAR(t["logprob"].get<double>(), row[t["token_id"].get<int64_t>()],
                  1e-4);
      if (t["token_id"] == prompt[i]) {
        EXPECT_EQ(t["logprob"], pl[i]);
      }
    }
  }
  // The greedy new tokens are their distributions' argmax, with the same
  // value in "logprobs" and in their top entry.
  const nlohmann::json& tops = (*whole)["top_logprobs"];
  ASSERT_EQ(tops.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_EQ(tops[i].size(), 3u);
    EXPECT_EQ(tops[i][0]["token_id"], (*whole)["token_ids"][i]);
    EXPECT_EQ(tops[i][0]["logprob"], (*whole)["logprobs"][i]);
  }
  // Chunked prefill: the same numbers up to the model's chunking tolerance;
  // --max-new-tokens 0 runs the prompt only.
  absl::StatusOr<nlohmann::json> chunked =
      Json(RunRun,
           {ckpt, absl::StrCat("--tokens=", kPrompt), "--max-new-tokens=0",
            "--chunk-tokens=4", "--prompt-logprobs", "--threads=1", "--json"});
  ASSERT_TRUE(chunked.ok()) << chunked.status();
  EXPECT_TRUE((*chunked)["token_ids"].empty());
  EXPECT_FALSE(chunked->contains("top_logprobs"));
  EXPECT_FALSE(chunked->contains("prompt_top_logprobs"));
  const nlohmann::json& cl = (*chunked)["prompt_logprobs"];
  ASSERT_EQ(cl.size(), prompt.size());
  EXPECT_TRUE(cl[0].is_null());
  for (size_t i = 1; i < prompt.size(); ++i) {
    EXPECT_NEAR(cl[i].get<double>(), pl[i].get<double>(), 1e-3);
  }
  std::ostringstream out;
  EXPECT_THAT(
      RunRun({ckpt, "--tokens=1,2", "--prompt-logprobs", "--top-logprobs=21"},
             out)
          .message(),
      HasSubstr("--top-logprobs"));
}

TEST(RunCommandTest, SeededSamplingIsReproducible) {
  const std::vector<std::string> argv = {"--checkpoint=" + Checkpoint(1),
                                         absl::StrCat("--tokens=", kPrompt),
                                         "--max-new-tokens=8",
                                         "--temperature=1.5",
                                         "--top-k=50",
                                         "--seed=7",
                                         "--ignore-eos",
                                         "--json"};
  absl::StatusOr<nlohmann::json> a = Json(RunRun, argv);
  absl::StatusOr<nlohmann::json> b = Json(RunRun, argv);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)["token_ids"], (*b)["token_ids"]);
  EXPECT_EQ((*a)["token_ids"].size(), 8u);
}

TEST(RunCommandTest, BadInput) {
  const std::string ckpt = "--checkpoint=" + Checkpoint(1);
  std::ostringstream out;
  EXPECT_THAT(RunRun({ckpt, "--tokens=1,2,99999"}, out).message(),
              HasSubstr("99999"));
  EXPECT_EQ(RunRun({"--tokens=1"}, out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(RunRun({ckpt}, out).message(), HasSubstr("--tokens"));
  EXPECT_THAT(RunRun({ckpt, "--tokens=1", "--top-p=2"}, out).message(),
              HasSubstr("--top-p"));
  EXPECT_EQ(RunRun({"--checkpoint=/nonexistent", "--tokens=1"}, out).code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(out.str().empty());
}

TEST(ScoreCommandTest, IdenticalCheckpointsAgreeCompletely) {
  absl::StatusOr<nlohmann::json> s =
      Json(RunScore, {"--checkpoint=" + Checkpoint(1),
                      "--reference=" + Checkpoint(1), "--sequences=2",
                      "--prompt-tokens=8", "--completion-tokens=6", "--json"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)["scored_tokens"], 12);
  EXPECT_EQ((*s)["argmax_agreement"], 1.0);
  EXPECT_NEAR((*s)["kl_max"].get<double>(), 0, 1e-9);
  EXPECT_EQ((*s)["mean_logprob"], (*s)["reference_mean_logprob"]);
}

TEST(ScoreCommandTest, DifferentModelsDisagree) {
  absl::StatusOr<nlohmann::json> s =
      Json(RunScore, {"--checkpoint=" + Checkpoint(2),
                      "--reference=" + Checkpoint(1), "--sequences=2",
                      "--prompt-tokens=8", "--completion-tokens=6", "--json"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_LT((*s)["argmax_agreement"].get<double>(), 0.5);
  EXPECT_GT((*s)["kl_mean"].get<double>(), 0.1);
  // The reference's own greedy completion is its most likely path.
  EXPECT_GT((*s)["reference_mean_logprob"].get<double>(),
            (*s)["mean_logprob"].get<double>());
}

TEST(ScoreCommandTest, PromptsFileErrorsNameTheLine) {
  const std::string path = absl::StrCat(getenv("TEST_TMPDIR"), "/prompts.txt");
  FILE* f = fopen(path.c_str(), "w");
  fputs("5,6,7\n\n8,x,9\n", f);
  fclose(f);
  std::ostringstream out;
  const absl::Status st =
      RunScore({"--checkpoint=" + Checkpoint(1), "--reference=" + Checkpoint(1),
                "--prompts=" + path},
               out);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("prompts.txt:3"));
}

}  // namespace
}  // namespace mneme::cli
