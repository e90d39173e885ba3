// The decode-context benchmark runs on both tiny released models at small
// contexts and reports sane fields. Nothing here is about speed: the
// checks are on what the timing backend counted (calls, keys, scored
// pairs) and on the shape of the report.

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/bench/worker/decode_context_bench_lib.h"

namespace mneme::bench {
namespace {

using ::testing::HasSubstr;

DecodeContextOptions Small(const std::string& name) {
  DecodeContextOptions o;
  // After the warm-up and timed steps (4 tokens) both sequences complete
  // a ratio-4 entry with the batched step's token.
  o.contexts = {63, 255};
  o.chunk_tokens = 64;
  o.decode_steps = 3;
  o.warmup_steps = 1;
  o.threads = 1;
  o.work_dir = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  return o;
}

TEST(DecodeContextBenchTest, RunsBothModelsAndReportsSaneFields) {
  const DecodeContextOptions o = Small("run");
  absl::StatusOr<std::vector<ModelResult>> results = RunDecodeContextBench(o);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 2u);
  EXPECT_EQ((*results)[0].arch, "v4-flash");
  EXPECT_EQ((*results)[1].arch, "v4.1-flash");
  for (const ModelResult& m : *results) {
    SCOPED_TRACE(m.arch);
    EXPECT_GT(m.weight_bytes, 0);
    EXPECT_GT(m.kv_budget_bytes, 0);
    ASSERT_EQ(m.contexts.size(), 2u);
    // A step of both sequences shares its projections: fewer calls than
    // two steps of one.
    EXPECT_GT(m.batched_step_calls, 0);
    EXPECT_LT(static_cast<double>(m.batched_step_calls),
              m.contexts[0].calls_per_step + m.contexts[1].calls_per_step);
    for (size_t i = 0; i < m.contexts.size(); ++i) {
      const ContextResult& r = m.contexts[i];
      SCOPED_TRACE(r.context);
      EXPECT_EQ(r.context, o.contexts[i]);
      EXPECT_EQ(r.steps, o.decode_steps);
      EXPECT_GT(r.prefill_s, 0);
      EXPECT_GT(r.prefill_calls_per_chunk, 0);
      EXPECT_GT(r.calls_per_step, 0);
      EXPECT_GT(r.step_ms_median, 0);
      EXPECT_GE(r.step_ms_p90, r.step_ms_median);
      EXPECT_GT(r.vs_first, 0);
      for (const double part : {r.attention_ms, r.index_ms, r.index_kernel_ms,
                                r.other_backend_ms, r.engram_ms, r.host_ms}) {
        EXPECT_GE(part, 0);
      }
      EXPECT_GT(r.attention_ms, 0);
      EXPECT_GT(r.index_ms, 0);
      EXPECT_LE(r.index_kernel_ms, r.index_ms);
      EXPECT_GT(r.other_backend_ms, 0);
      EXPECT_GT(r.mean_step_ms, 0);
      EXPECT_GT(r.attended_keys, 0);
      EXPECT_GT(r.index_pairs, 0);
      EXPECT_GT(r.index_kernel_ns_per_pair, 0);
      EXPECT_GE(r.index_ns_per_pair, r.index_kernel_ns_per_pair);
    }
    EXPECT_DOUBLE_EQ(m.contexts[0].vs_first, 1.0);
    // Four times the context: the indexer scores about four times the
    // entries, while attention looks at the window and top-k selections
    // (saturated already at 64 tokens) plus, on V4, the few ratio-128
    // entries.
    const ContextResult& a = m.contexts[0];
    const ContextResult& b = m.contexts[1];
    EXPECT_GT(b.index_pairs, 3.0 * a.index_pairs);
    EXPECT_LT(b.attended_keys, 1.1 * a.attended_keys);
  }
  const std::string table = FormatTables(*results);
  EXPECT_THAT(table, HasSubstr("| v4-flash | 255 |"));
  EXPECT_THAT(table, HasSubstr("| v4.1-flash | 63 |"));
  const nlohmann::json json = ToJson(o, *results);
  ASSERT_EQ(json["models"].size(), 2u);
  EXPECT_EQ(json["models"][1]["contexts"][1]["context"], 255);
  EXPECT_TRUE(json["models"][0]["contexts"][0].contains("index_ns_per_pair"));
}

// The batched step of two sequences scores their indexer queries, chooses
// their entries and pools their completed entries in as many calls, and
// waits for the backend as often, as a step of one sequence (the first
// context alone) does; the calls by operation add up to the calls.
TEST(DecodeContextBenchTest, BatchedStepScoresAndPoolsSequencesTogether) {
  DecodeContextOptions one = Small("one");
  one.contexts.resize(1);
  absl::StatusOr<std::vector<ModelResult>> alone = RunDecodeContextBench(one);
  ASSERT_TRUE(alone.ok()) << alone.status();
  absl::StatusOr<std::vector<ModelResult>> both =
      RunDecodeContextBench(Small("both"));
  ASSERT_TRUE(both.ok()) << both.status();
  ASSERT_EQ(alone->size(), both->size());
  for (size_t i = 0; i < both->size(); ++i) {
    const ModelResult& a = (*alone)[i];
    const ModelResult& b = (*both)[i];
    SCOPED_TRACE(b.arch);
    for (const ModelResult* m : {&a, &b}) {
      int64_t sum = 0;
      for (const auto& [op, n] : m->batched_step_calls_by_op) sum += n;
      EXPECT_EQ(sum, m->batched_step_calls);
    }
    const auto calls = [](const ModelResult& m, const std::string& op) {
      const auto it = m.batched_step_calls_by_op.find(op);
      return it == m.batched_step_calls_by_op.end() ? 0 : it->second;
    };
    // V4's decode queries attend the entries their indexer chooses in the
    // same call (nothing comes back); V4.1's choices come back, as the
    // layers after an index source reuse them.
    const bool v4 = b.arch == "v4-flash";
    const std::string choose = v4 ? "ChooseAndAttend" : "SelectTopK";
    for (const std::string& op :
         {std::string("IndexScores"), std::string("SoftmaxPool"), choose}) {
      SCOPED_TRACE(op);
      EXPECT_GT(calls(a, op), 0);
      EXPECT_EQ(calls(b, op), calls(a, op));
    }
    if (v4) {
      EXPECT_EQ(calls(b, "SelectTopK"), 0);
    }
    EXPECT_GT(a.batched_step_host_waits, 0);
    EXPECT_EQ(b.batched_step_host_waits, a.batched_step_host_waits);
  }
}

TEST(DecodeContextBenchTest, RejectsBadOptions) {
  DecodeContextOptions o = Small("bad");
  o.contexts = {63, 63};
  EXPECT_EQ(RunDecodeContextBench(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = Small("bad");
  o.chunk_tokens = 0;
  EXPECT_EQ(RunDecodeContextBench(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = Small("bad");
  o.work_dir.clear();
  EXPECT_EQ(RunDecodeContextBench(o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mneme::bench
