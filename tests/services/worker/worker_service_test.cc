// The Worker gRPC service in process (127.0.0.1, any port) over the tiny
// synthetic model: prompt log-probabilities and the sampled token's top
// alternatives equal a log_softmax of the OUTPUT_LOGITS_ALL logits of the
// same tokens, within a chunk and across a chunk split, and the bounds of
// the new fields are INVALID_ARGUMENT.

#include "services/worker/worker_service.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_channel.h"
#include "common/inflight_gate.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/worker/v1/worker.grpc.pb.h"
#include "services/common/server_runner.h"
#include "services/worker/local_model.h"
#include "tools/synthetic/release_checkpoint.h"

namespace mneme::worker {
namespace {

using ::testing::HasSubstr;

const std::string& TinyCheckpoint() {
  static const std::string* dir = [] {
    auto* d = new std::string(absl::StrCat(getenv("TEST_TMPDIR"), "/tiny"));
    synthetic::ReleaseCheckpointOptions o;
    o.threads = 1;
    o.out_dir = *d;
    o.seed = 5;
    const absl::Status st = synthetic::MakeReleaseCheckpoint(o);
    EXPECT_TRUE(st.ok()) << st;
    return d;
  }();
  return *dir;
}

// log_softmax of one row, in double (independent of the service's code).
std::vector<double> LogSoftmax(const float* row, int64_t n) {
  double max = row[0];
  for (int64_t i = 1; i < n; ++i) max = std::max<double>(max, row[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(row[i] - max);
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = row[i] - max - std::log(sum);
  return out;
}

// The n most likely ids of a row, most likely first.
std::vector<int64_t> TopIds(const std::vector<double>& lp, int n) {
  std::vector<int64_t> ids(lp.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int64_t a, int64_t b) { return lp[a] > lp[b]; });
  ids.resize(n);
  return ids;
}

v1::SequenceChunk Chunk(uint64_t id, const std::vector<int64_t>& tokens,
                        int64_t begin, int64_t end, v1::Output output) {
  v1::SequenceChunk c;
  c.set_sequence_id(id);
  c.mutable_token_ids()->Add(tokens.begin() + begin, tokens.begin() + end);
  c.set_start_position(begin);
  c.set_output(output);
  return c;
}

class WorkerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { Serve(WorkerServiceOptions()); }

  void Serve(const WorkerServiceOptions& options) {
    runner_.reset();  // Drains and closes the old gate.
    service_.reset();
    gate_ = std::make_unique<InflightGate>();
    if (local_ == nullptr) {
      LocalModelOptions lo;
      lo.checkpoint_dir = TinyCheckpoint();
      lo.threads = 1;
      lo.model.kv_cache.budget_bytes = 16 << 20;
      absl::StatusOr<std::unique_ptr<LocalModel>> local =
          LocalModel::Create(lo);
      ASSERT_TRUE(local.ok()) << local.status();
      local_ = *std::move(local);
    }
    absl::StatusOr<std::unique_ptr<WorkerService>> service =
        WorkerService::Create(options, gate_.get());
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = *std::move(service);
    service_->Attach(&local_->model(), &local_->backend(), nullptr);
    absl::StatusOr<std::unique_ptr<ServerRunner>> runner =
        ServerRunner::Create(ServerOptions(), {service_.get()}, gate_.get());
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = *std::move(runner);
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        CreateClientChannel(runner_->address().ToString(), {});
    ASSERT_TRUE(channel.ok()) << channel.status();
    stub_ = v1::Worker::NewStub(*channel);
  }

  grpc::Status Step(const v1::StepRequest& request,
                    v1::StepResponse& response) {
    grpc::ClientContext context;
    return stub_->Step(&context, request, &response);
  }

  // A step of the one chunk `c` is INVALID_ARGUMENT, its message naming
  // `what`.
  void ExpectRefused(const v1::SequenceChunk& c, const std::string& what) {
    v1::StepRequest r;
    *r.add_chunks() = c;
    v1::StepResponse s;
    const grpc::Status st = Step(r, s);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << what;
    EXPECT_THAT(st.error_message(), HasSubstr(what));
  }

  int64_t vocab() const { return local_->model().dims().vocab_size; }

  std::unique_ptr<LocalModel> local_;
  std::unique_ptr<InflightGate> gate_;
  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<ServerRunner> runner_;
  std::unique_ptr<v1::Worker::Stub> stub_;
};

const std::vector<int64_t> kTokens = {5,   9,  200, 31, 7,  7,
                                      400, 12, 13,  14, 15, 16};

TEST_F(WorkerServiceTest, PromptLogprobsAreLogSoftmaxOfTheLogits) {
  const int64_t n = static_cast<int64_t>(kTokens.size());
  const int64_t v = vocab();
  constexpr int kTop = 4;
  // Sequence 1: the reference logits of every position. Sequence 2: the
  // same tokens in one chunk with prompt logprobs. Sequence 3: in two
  // chunks, the second sampling greedily.
  v1::StepRequest r1;
  r1.set_step_id(1);
  *r1.add_chunks() = Chunk(1, kTokens, 0, n, v1::OUTPUT_LOGITS_ALL);
  v1::SequenceChunk* whole = r1.add_chunks();
  *whole = Chunk(2, kTokens, 0, n, v1::OUTPUT_NONE);
  whole->set_prompt_logprobs(true);
  whole->set_top_logprobs(kTop);
  const int64_t split = 5;
  v1::SequenceChunk* first = r1.add_chunks();
  *first = Chunk(3, kTokens, 0, split, v1::OUTPUT_NONE);
  first->set_prompt_logprobs(true);
  first->set_top_logprobs(kTop);
  first->set_next_token_id(kTokens[split]);
  v1::StepResponse s1;
  ASSERT_TRUE(Step(r1, s1).ok());
  ASSERT_EQ(s1.results_size(), 3);
  const v1::ChunkResult& logits = s1.results(0);
  ASSERT_EQ(logits.logits_size(), n * v);
  EXPECT_EQ(s1.results(1).logits_size(), 0);  // Never the logits.

  v1::StepRequest r2;
  r2.set_step_id(2);
  v1::SequenceChunk* second = r2.add_chunks();
  *second = Chunk(3, kTokens, split, n, v1::OUTPUT_SAMPLE);
  second->set_prompt_logprobs(true);
  second->set_top_logprobs(kTop);
  v1::StepResponse s2;
  ASSERT_TRUE(Step(r2, s2).ok());
  ASSERT_EQ(s2.results_size(), 1);

  std::vector<v1::PositionLogprobs> split_positions(
      s1.results(2).positions().begin(), s1.results(2).positions().end());
  ASSERT_EQ(split_positions.size(), static_cast<size_t>(split));
  split_positions.insert(split_positions.end(),
                         s2.results(0).positions().begin(),
                         s2.results(0).positions().end());
  const auto& one_chunk = s1.results(1).positions();
  ASSERT_EQ(one_chunk.size(), n);
  ASSERT_EQ(split_positions.size(), static_cast<size_t>(n));
  for (int64_t p = 0; p < n; ++p) {
    SCOPED_TRACE(absl::StrCat("position ", p));
    const std::vector<double> ref =
        LogSoftmax(logits.logits().data() + p * v, v);
    const std::vector<int64_t> top = TopIds(ref, kTop);
    const v1::PositionLogprobs* const both[] = {
        &one_chunk.Get(static_cast<int>(p)), &split_positions[p]};
    for (const v1::PositionLogprobs* lp : both) {
      // Same chunk as the logits: equal up to rounding; across the split:
      // up to the model's chunking tolerance.
      const double tol = lp == &split_positions[p] ? 1e-3 : 1e-4;
      if (p + 1 < n) {
        EXPECT_NEAR(lp->target_logprob(), ref[kTokens[p + 1]], tol);
      } else {
        EXPECT_TRUE(std::isnan(lp->target_logprob()));
      }
      ASSERT_EQ(lp->top_ids_size(), kTop);
      ASSERT_EQ(lp->top_logprobs_size(), kTop);
      EXPECT_EQ(lp->top_ids(0), top[0]);
      for (int k = 0; k < kTop; ++k) {
        EXPECT_NEAR(lp->top_logprobs(k), ref[lp->top_ids(k)], tol);
        if (k > 0) {
          EXPECT_LE(lp->top_logprobs(k), lp->top_logprobs(k - 1));
        }
      }
    }
  }
  // The greedy sample is the last position's argmax; its logprob is the
  // identical float of its top entry, which the prompt positions repeat.
  const v1::ChunkResult& sampled = s2.results(0);
  const v1::PositionLogprobs& last = split_positions.back();
  EXPECT_EQ(sampled.token_id(), last.top_ids(0));
  ASSERT_EQ(sampled.top_ids_size(), kTop);
  EXPECT_EQ(sampled.top_ids(0), sampled.token_id());
  EXPECT_EQ(sampled.logprob(), sampled.top_logprobs(0));
  EXPECT_EQ(sampled.top_logprobs(0), last.top_logprobs(0));
  // Within one chunk the target value is the same float as its top entry.
  for (int64_t p = 0; p + 1 < n; ++p) {
    const v1::PositionLogprobs& lp = one_chunk.Get(static_cast<int>(p));
    for (int k = 0; k < kTop; ++k) {
      if (lp.top_ids(k) == kTokens[p + 1]) {
        EXPECT_EQ(lp.target_logprob(), lp.top_logprobs(k));
      }
    }
  }
}

TEST_F(WorkerServiceTest, TopLogprobsZeroReturnsTargetsOnly) {
  v1::StepRequest r;
  v1::SequenceChunk* c = r.add_chunks();
  *c = Chunk(7, kTokens, 0, 4, v1::OUTPUT_SAMPLE);
  c->set_prompt_logprobs(true);
  c->set_next_token_id(-1);
  v1::StepResponse s;
  ASSERT_TRUE(Step(r, s).ok());
  ASSERT_EQ(s.results(0).positions_size(), 4);
  for (const v1::PositionLogprobs& lp : s.results(0).positions()) {
    EXPECT_EQ(lp.top_ids_size(), 0);
  }
  EXPECT_LT(s.results(0).positions(0).target_logprob(), 0);
  EXPECT_TRUE(std::isnan(s.results(0).positions(3).target_logprob()));
  EXPECT_EQ(s.results(0).top_ids_size(), 0);
}

TEST_F(WorkerServiceTest, BadLogprobFieldsAreInvalidArgument) {
  v1::SequenceChunk c = Chunk(9, kTokens, 0, 4, v1::OUTPUT_SAMPLE);
  c.set_top_logprobs(21);
  ExpectRefused(c, "top_logprobs");
  c.set_top_logprobs(-1);
  ExpectRefused(c, "top_logprobs");
  c.set_top_logprobs(0);
  c.set_prompt_logprobs(true);
  c.set_next_token_id(vocab());
  ExpectRefused(c, "next_token_id");
  c.set_next_token_id(-2);
  ExpectRefused(c, "next_token_id");
  // Nothing ran: the sequence is still new.
  c.set_next_token_id(-1);
  v1::StepRequest ok;
  *ok.add_chunks() = c;
  v1::StepResponse s;
  EXPECT_TRUE(Step(ok, s).ok());
}

TEST_F(WorkerServiceTest, ResponseLimitCountsLogprobValues) {
  WorkerServiceOptions o;
  // 12 positions x (1 + 2 x 20) values do not fit; 12 x (1 + 2 x 2) do.
  o.max_response_logits = 100;
  Serve(o);
  v1::StepRequest r;
  v1::SequenceChunk* c = r.add_chunks();
  *c = Chunk(11, kTokens, 0, static_cast<int64_t>(kTokens.size()),
             v1::OUTPUT_NONE);
  c->set_prompt_logprobs(true);
  c->set_top_logprobs(20);
  v1::StepResponse s;
  const grpc::Status st = Step(r, s);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("more than the 100"));
  c->set_top_logprobs(2);
  s.Clear();
  EXPECT_TRUE(Step(r, s).ok());
  EXPECT_EQ(s.results(0).positions_size(), static_cast<int>(kTokens.size()));
}

// At TP 1 the rank is always in its group; JoinGroup forgets every sequence
// (as when a group re-forms) and is refused for a generation that is not
// positive.
TEST_F(WorkerServiceTest, JoinGroupForgetsTheSequences) {
  v1::GetInfoResponse info;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->GetInfo(&context, {}, &info).ok());
  }
  EXPECT_TRUE(info.in_group());
  EXPECT_EQ(info.group_generation(), 0);
  v1::StepRequest step;
  step.set_step_id(1);
  *step.add_chunks() = Chunk(7, kTokens, 0, 4, v1::OUTPUT_SAMPLE);
  v1::StepResponse response;
  ASSERT_TRUE(Step(step, response).ok());
  EXPECT_EQ(local_->model().num_sequences(), 1);

  v1::JoinGroupRequest join;
  v1::JoinGroupResponse joined;
  {
    grpc::ClientContext context;
    join.set_generation(0);
    EXPECT_EQ(stub_->JoinGroup(&context, join, &joined).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    grpc::ClientContext context;
    join.set_generation(1);
    join.set_coordinator_id(std::string(300, 'c'));
    EXPECT_EQ(stub_->JoinGroup(&context, join, &joined).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  EXPECT_EQ(local_->model().num_sequences(), 1);
  {
    grpc::ClientContext context;
    join.set_coordinator_id("c");
    const grpc::Status st = stub_->JoinGroup(&context, join, &joined);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  EXPECT_EQ(joined.generation(), 1);
  EXPECT_EQ(local_->model().num_sequences(), 0);
  // The sequence is gone: its next chunk must start at position 0 again.
  v1::StepRequest next;
  next.set_step_id(2);
  *next.add_chunks() = Chunk(7, kTokens, 4, 5, v1::OUTPUT_SAMPLE);
  EXPECT_EQ(Step(next, response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// A decode step sent before the previous step's token is known: the chunk
// starts with the token the worker sampled, and computes what the chunk
// with that token spelled out computes.
TEST_F(WorkerServiceTest, StartsWithSampledTokenContinuesTheSequence) {
  auto sample = [&](v1::SequenceChunk c) -> v1::ChunkResult {
    v1::StepRequest r;
    *r.add_chunks() = std::move(c);
    v1::StepResponse s;
    const grpc::Status st = Step(r, s);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return s.results_size() == 1 ? s.results(0) : v1::ChunkResult();
  };
  // Sequence 21 spells every token out; sequence 22 starts with its own.
  const v1::ChunkResult a1 =
      sample(Chunk(21, kTokens, 0, 4, v1::OUTPUT_SAMPLE));
  const v1::ChunkResult b1 =
      sample(Chunk(22, kTokens, 0, 4, v1::OUTPUT_SAMPLE));
  ASSERT_EQ(a1.token_id(), b1.token_id());
  v1::SequenceChunk spelled =
      Chunk(21, {a1.token_id()}, 0, 1, v1::OUTPUT_SAMPLE);
  spelled.set_start_position(4);
  const v1::ChunkResult a2 = sample(spelled);
  v1::SequenceChunk next;
  next.set_sequence_id(22);
  next.set_start_position(4);
  next.set_output(v1::OUTPUT_SAMPLE);
  next.set_starts_with_sampled_token(true);
  const v1::ChunkResult b2 = sample(next);
  EXPECT_EQ(b2.token_id(), a2.token_id());
  EXPECT_EQ(b2.logprob(), a2.logprob());

  // Its sampled token is at position 5 now.
  ExpectRefused(next, "no sampled token at position 4");
  next.set_start_position(6);
  ExpectRefused(next, "no sampled token at position 6");
  next.set_start_position(5);
  next.set_prompt_logprobs(true);
  ExpectRefused(next, "prompt_logprobs");
  next.set_prompt_logprobs(false);
  next.set_sequence_id(23);
  ExpectRefused(next, "sequence 23 has no sampled token");
  // Released: the token is forgotten with the sequence.
  next.set_sequence_id(22);
  v1::StepRequest release;
  release.add_release_sequence_ids(22);
  v1::StepResponse released;
  ASSERT_TRUE(Step(release, released).ok());
  ExpectRefused(next, "sequence 22 has no sampled token");
}

// Steps written back to back on one StepStream run in order and are
// answered in order; a refused step is answered with its error and the
// stream goes on.
TEST_F(WorkerServiceTest, StepStreamAnswersQueuedStepsInOrder) {
  // The reference: the same decode with every token spelled out, unary.
  std::vector<int64_t> expected;
  {
    std::vector<int64_t> tokens(kTokens.begin(), kTokens.begin() + 4);
    for (int i = 0; i < 5; ++i) {
      v1::StepRequest r;
      const int64_t begin =
          i == 0 ? 0 : static_cast<int64_t>(tokens.size()) - 1;
      *r.add_chunks() =
          Chunk(31, tokens, begin, static_cast<int64_t>(tokens.size()),
                v1::OUTPUT_SAMPLE);
      v1::StepResponse s;
      ASSERT_TRUE(Step(r, s).ok());
      tokens.push_back(s.results(0).token_id());
      expected.push_back(s.results(0).token_id());
    }
  }
  grpc::ClientContext context;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::StepRequest, v1::StepStreamResponse>>
      stream = stub_->StepStream(&context);
  std::vector<v1::StepRequest> steps;
  {
    v1::StepRequest r;
    r.set_step_id(1);
    *r.add_chunks() = Chunk(32, kTokens, 0, 4, v1::OUTPUT_SAMPLE);
    steps.push_back(r);
  }
  for (int i = 1; i < 5; ++i) {
    v1::StepRequest r;
    r.set_step_id(1 + i);
    v1::SequenceChunk* c = r.add_chunks();
    c->set_sequence_id(32);
    c->set_start_position(3 + i);
    c->set_output(v1::OUTPUT_SAMPLE);
    c->set_starts_with_sampled_token(true);
    steps.push_back(r);
    if (i == 2) {
      // A refused step between them (a token outside the vocabulary).
      v1::StepRequest bad;
      bad.set_step_id(100);
      *bad.add_chunks() = Chunk(33, {vocab()}, 0, 1, v1::OUTPUT_SAMPLE);
      steps.push_back(bad);
    }
  }
  // All written before any answer is read: they queue on the worker (at
  // most kMaxStreamedSteps at once; the transport holds the rest).
  for (const v1::StepRequest& r : steps) ASSERT_TRUE(stream->Write(r));
  ASSERT_TRUE(stream->WritesDone());
  std::vector<int64_t> got;
  for (const v1::StepRequest& r : steps) {
    v1::StepStreamResponse answer;
    ASSERT_TRUE(stream->Read(&answer));
    if (r.step_id() == 100) {
      EXPECT_EQ(answer.code(),
                static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
      EXPECT_THAT(answer.message(), HasSubstr("vocab"));
      continue;
    }
    ASSERT_EQ(answer.code(), 0) << answer.message();
    EXPECT_EQ(answer.response().step_id(), r.step_id());
    got.push_back(answer.response().results(0).token_id());
  }
  v1::StepStreamResponse extra;
  EXPECT_FALSE(stream->Read(&extra));
  const grpc::Status st = stream->Finish();
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(got, expected);
}

// A step refused before it was queued (the step queue is full) is answered
// in its place, after the steps read before it.
TEST_F(WorkerServiceTest, StepStreamAnswersRefusalsInOrder) {
  WorkerServiceOptions o;
  o.max_queued_steps = 1;
  Serve(o);
  grpc::ClientContext context;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::StepRequest, v1::StepStreamResponse>>
      stream = stub_->StepStream(&context);
  // While the first runs or waits, a later one may be refused at once
  // (a one-step queue); its refusal still comes in its place.
  for (uint64_t id = 1; id <= 3; ++id) {
    v1::StepRequest r;
    r.set_step_id(id);
    *r.add_chunks() =
        Chunk(40 + id, kTokens, 0, static_cast<int64_t>(kTokens.size()),
              v1::OUTPUT_SAMPLE);
    ASSERT_TRUE(stream->Write(r));
  }
  ASSERT_TRUE(stream->WritesDone());
  for (uint64_t id = 1; id <= 3; ++id) {
    v1::StepStreamResponse answer;
    ASSERT_TRUE(stream->Read(&answer));
    EXPECT_EQ(answer.step_id(), id);
    if (answer.code() == 0) {
      EXPECT_EQ(answer.response().step_id(), id);
    } else {
      // The first always runs; a later one may find the queue full.
      EXPECT_NE(id, 1u);
      EXPECT_EQ(answer.code(),
                static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED))
          << answer.message();
    }
  }
  EXPECT_TRUE(stream->Finish().ok());
}

}  // namespace
}  // namespace mneme::worker
