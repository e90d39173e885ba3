// The coordinator's engine against a fake worker group: admission and
// validation, streamed tokens, every stop condition, aborts, worker
// failures reaching the caller with the right status code, and prompt and
// top log-probabilities (order, chunks, preemption).

#include "services/coordinator/engine.h"

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/coordinator/request_validator.h"
#include "services/coordinator/worker_group.h"
#include "tests/services/coordinator/fake_worker_group.h"

namespace mneme::coordinator {
namespace {

using ::mneme::coordinator::testing::FakeWorkerGroup;
using ::mneme::coordinator::testing::FakeWorkerGroupOptions;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr absl::Duration kWait = absl::Seconds(30);

// Records one request's events, their order ("prompt", "top", "tokens",
// "finish") and its log-probabilities.
class RecordingSink final : public GenerateSink {
 public:
  // Returns false from OnTokens once `stop_after` tokens came (0 = never).
  explicit RecordingSink(int stop_after = 0) : stop_after_(stop_after) {}

  void OnPromptLogprobs(absl::Span<const TokenLogprobs> positions) override {
    absl::MutexLock lock(&mu_);
    events_.emplace_back("prompt");
    prompt_.assign(positions.begin(), positions.end());
  }
  void OnTopLogprobs(absl::Span<const TopLogprobs> per_token) override {
    absl::MutexLock lock(&mu_);
    events_.emplace_back("top");
    tops_.insert(tops_.end(), per_token.begin(), per_token.end());
  }
  bool OnTokens(absl::Span<const int64_t> tokens,
                absl::Span<const float> logprobs) override {
    absl::MutexLock lock(&mu_);
    events_.emplace_back("tokens");
    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
    logprobs_.insert(logprobs_.end(), logprobs.begin(), logprobs.end());
    return stop_after_ == 0 || static_cast<int>(tokens_.size()) < stop_after_;
  }
  void OnFinish(const absl::Status& status, GenerateEnd end,
                int64_t prompt_tokens, int64_t completion_tokens) override {
    absl::MutexLock lock(&mu_);
    EXPECT_FALSE(finished_) << "OnFinish twice";
    events_.emplace_back("finish");
    finished_ = true;
    status_ = status;
    end_ = end;
    prompt_tokens_ = prompt_tokens;
    completion_tokens_ = completion_tokens;
  }

  // Waits for OnFinish; false if it did not come in time.
  bool AwaitFinish() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&finished_), kWait);
  }
  bool AwaitTokens(int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return static_cast<int>(tokens_.size()) >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), kWait);
  }
  bool finished() {
    absl::MutexLock lock(&mu_);
    return finished_;
  }
  std::vector<int64_t> tokens() {
    absl::MutexLock lock(&mu_);
    return tokens_;
  }
  std::vector<float> logprobs() {
    absl::MutexLock lock(&mu_);
    return logprobs_;
  }
  absl::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  GenerateEnd end() {
    absl::MutexLock lock(&mu_);
    return end_;
  }
  int64_t prompt_tokens() {
    absl::MutexLock lock(&mu_);
    return prompt_tokens_;
  }
  int64_t completion_tokens() {
    absl::MutexLock lock(&mu_);
    return completion_tokens_;
  }
  std::vector<std::string> events() {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  std::vector<TokenLogprobs> prompt() {
    absl::MutexLock lock(&mu_);
    return prompt_;
  }
  std::vector<TopLogprobs> tops() {
    absl::MutexLock lock(&mu_);
    return tops_;
  }

 private:
  const int stop_after_;
  absl::Mutex mu_;
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
  std::vector<TokenLogprobs> prompt_ ABSL_GUARDED_BY(mu_);
  std::vector<TopLogprobs> tops_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> tokens_ ABSL_GUARDED_BY(mu_);
  std::vector<float> logprobs_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  GenerateEnd end_ ABSL_GUARDED_BY(mu_) = GenerateEnd::kLength;
  int64_t prompt_tokens_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t completion_tokens_ ABSL_GUARDED_BY(mu_) = -1;
};

GenerateParams Params(std::vector<int64_t> prompt, int64_t max_new_tokens) {
  GenerateParams p;
  p.prompt = std::move(prompt);
  p.max_new_tokens = max_new_tokens;
  p.sampling.set_top_p(1);
  return p;
}

// The fake's default tokens after a prompt of `prompt_length`.
std::vector<int64_t> Expected(int prompt_length, int n) {
  std::vector<int64_t> out;
  out.reserve(n);
  for (int i = 0; i < n; ++i) {
    out.push_back(FakeWorkerGroup::DefaultToken(0, prompt_length + i));
  }
  return out;
}

// The engine over a fake group, one step at a time (a group that runs each
// step as it is started) or with overlap scheduling over a pipelined group
// (steps queue in order; decodes planned ahead start with the token the
// step before samples).
class EngineFixture : public ::testing::Test {
 protected:
  virtual bool Pipelined() const = 0;

  void SetUp() override { Start(EngineOptions()); }

  void Start(EngineOptions options, FakeWorkerGroupOptions fake = {}) {
    engine_.reset();
    fake.pipelined = Pipelined();
    workers_ = std::make_unique<FakeWorkerGroup>(fake);
    metrics_ = std::make_unique<MetricsRegistry>();
    options.ready_poll_interval = absl::Milliseconds(1);
    options.scheduler.max_context_tokens = 256;
    absl::StatusOr<std::unique_ptr<Engine>> engine =
        Engine::Create(options, workers_.get(), metrics_.get());
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    engine_->Start();
    ASSERT_TRUE(engine_->AwaitReady(kWait));
  }

  // Submits and waits for the end.
  std::shared_ptr<RecordingSink> Run(GenerateParams params) {
    auto sink = std::make_shared<RecordingSink>();
    absl::StatusOr<std::string> id = engine_->Submit(std::move(params), sink);
    EXPECT_TRUE(id.ok()) << id.status();
    if (id.ok()) {
      EXPECT_TRUE(sink->AwaitFinish());
    }
    return sink;
  }

  void TearDown() override {
    if (engine_ != nullptr) engine_->Stop();
    if (workers_ != nullptr) workers_->Resume();
  }

  std::unique_ptr<FakeWorkerGroup> workers_;
  std::unique_ptr<MetricsRegistry> metrics_;
  std::unique_ptr<Engine> engine_;
};

// Every test runs on both step paths.
class EngineTest : public EngineFixture,
                   public ::testing::WithParamInterface<bool> {
 protected:
  bool Pipelined() const override { return GetParam(); }
};

TEST_P(EngineTest, ModelInfoComesFromTheWorkers) {
  absl::StatusOr<ModelInfo> info = engine_->model_info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->checkpoint, "/fake/checkpoint");
  EXPECT_EQ(info->vocab_size, 1000);
  EXPECT_EQ(info->eos_token_id, 1);
  EXPECT_EQ(info->max_context_tokens, 256);
  EXPECT_EQ(info->tp_size, 1);
  EXPECT_EQ(info->dcp_size, 1);
}

TEST_P(EngineTest, StreamsTokensUntilMaxNewTokens) {
  GenerateParams p = Params({5, 6, 7}, 4);
  p.logprobs = true;
  std::shared_ptr<RecordingSink> sink = Run(p);
  EXPECT_TRUE(sink->status().ok()) << sink->status();
  EXPECT_EQ(sink->end(), GenerateEnd::kLength);
  EXPECT_EQ(sink->tokens(), Expected(3, 4));
  EXPECT_THAT(sink->logprobs(), ElementsAre(-0.5f, -0.5f, -0.5f, -0.5f));
  EXPECT_EQ(sink->prompt_tokens(), 3);
  EXPECT_EQ(sink->completion_tokens(), 4);
  // Every step sent the sequence its tokens so far: the prompt, then one
  // token per decode.
  const std::vector<worker::v1::StepRequest> steps = workers_->steps();
  ASSERT_GE(steps.size(), 4u);
  EXPECT_THAT(steps[0].chunks(0).token_ids(), ElementsAre(5, 6, 7));
  EXPECT_EQ(steps[1].chunks(0).start_position(), 3);
  EXPECT_THAT(steps[1].chunks(0).token_ids(), ElementsAre(Expected(3, 1)[0]));
}

TEST_P(EngineTest, LogprobsOnlyWhenAsked) {
  std::shared_ptr<RecordingSink> sink = Run(Params({5, 6, 7}, 2));
  EXPECT_EQ(sink->tokens().size(), 2u);
  EXPECT_THAT(sink->logprobs(), IsEmpty());
}

TEST_P(EngineTest, StopsAtEosUnlessIgnored) {
  // The third new token is eos.
  workers_->SetTokenRule([](uint64_t, int64_t position) -> int64_t {
    return position == 5 ? 1 : FakeWorkerGroup::DefaultToken(0, position);
  });
  std::shared_ptr<RecordingSink> sink = Run(Params({5, 6, 7}, 10));
  EXPECT_TRUE(sink->status().ok()) << sink->status();
  EXPECT_EQ(sink->end(), GenerateEnd::kStop);
  EXPECT_THAT(sink->tokens(), ElementsAre(103, 104, 1));
  EXPECT_EQ(sink->completion_tokens(), 3);

  GenerateParams p = Params({5, 6, 7}, 4);
  p.ignore_eos = true;
  sink = Run(p);
  EXPECT_EQ(sink->end(), GenerateEnd::kLength);
  EXPECT_THAT(sink->tokens(), ElementsAre(103, 104, 1, 106));
}

TEST_P(EngineTest, StopsAtAStopToken) {
  GenerateParams p = Params({5, 6, 7}, 10);
  p.stop_token_ids = {104};
  std::shared_ptr<RecordingSink> sink = Run(p);
  EXPECT_EQ(sink->end(), GenerateEnd::kStop);
  EXPECT_THAT(sink->tokens(), ElementsAre(103, 104));
}

TEST_P(EngineTest, StopsWhenTheSinkSaysSo) {
  // A stop string in the text: the sink refuses more after two tokens.
  auto sink = std::make_shared<RecordingSink>(/*stop_after=*/2);
  ASSERT_TRUE(engine_->Submit(Params({5, 6, 7}, 10), sink).ok());
  ASSERT_TRUE(sink->AwaitFinish());
  EXPECT_TRUE(sink->status().ok());
  EXPECT_EQ(sink->end(), GenerateEnd::kStop);
  EXPECT_EQ(sink->tokens(), Expected(3, 2));
}

TEST_P(EngineTest, InvalidRequestsNameTheirField) {
  struct Case {
    GenerateParams params;
    std::string field;
  };
  std::vector<Case> cases;
  cases.push_back({Params({}, 4), "token_ids"});
  cases.push_back({Params({5, 1000}, 4), "token_ids"});
  cases.push_back({Params({5, -1}, 4), "token_ids"});
  cases.push_back({Params({5}, 0), "max_new_tokens"});
  cases.push_back({Params({5}, -3), "max_new_tokens"});
  cases.push_back({Params(std::vector<int64_t>(250, 5), 10), "token_ids"});
  cases.push_back({Params({5}, 4), "stop_token_ids"});
  cases.back().params.stop_token_ids = {7, 5000};
  cases.push_back({Params({5}, 4), "temperature"});
  cases.back().params.sampling.set_temperature(-1);
  cases.push_back({Params({5}, 4), "top_p"});
  cases.back().params.sampling.set_top_p(1.5);
  cases.push_back({Params({5}, 4), "top_k"});
  cases.back().params.sampling.set_top_k(-2);
  cases.push_back({Params({5}, 4), "min_p"});
  cases.back().params.sampling.set_min_p(2);
  cases.push_back({Params({5}, 4), "request_id"});
  cases.back().params.request_id = std::string(kMaxRequestIdBytes + 1, 'x');
  for (Case& c : cases) {
    auto sink = std::make_shared<RecordingSink>();
    absl::StatusOr<std::string> id = engine_->Submit(c.params, sink);
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument)
        << c.field << ": " << id.status();
    EXPECT_EQ(InvalidFieldName(id.status()), c.field) << id.status();
    EXPECT_FALSE(sink->finished());
  }
  EXPECT_EQ(engine_->loads().waiting, 0);
  EXPECT_EQ(engine_->loads().running, 0);
  // Still serving.
  EXPECT_EQ(Run(Params({5}, 1))->tokens().size(), 1u);
}

TEST_P(EngineTest, NotReadyIsUnavailable) {
  engine_->Stop();
  engine_.reset();
  workers_->SetInfoStatus(absl::UnavailableError("worker 0 is starting"));
  EngineOptions options;
  options.ready_poll_interval = absl::Milliseconds(1);
  options.scheduler.max_context_tokens = 256;
  metrics_ = std::make_unique<MetricsRegistry>();
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(options, workers_.get(), metrics_.get());
  ASSERT_TRUE(engine.ok()) << engine.status();
  engine_ = *std::move(engine);
  engine_->Start();
  auto sink = std::make_shared<RecordingSink>();
  EXPECT_EQ(engine_->Submit(Params({5}, 1), sink).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(engine_->model_info().status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(engine_->ready());
  workers_->SetInfoStatus(absl::OkStatus());
  ASSERT_TRUE(engine_->AwaitReady(kWait));
  EXPECT_EQ(Run(Params({5}, 2))->tokens(), Expected(1, 2));
}

TEST_P(EngineTest, DuplicateIdsAndAdmissionLimits) {
  EngineOptions options;
  options.scheduler.max_num_seqs = 1;
  options.scheduler.max_queued_requests = 1;
  Start(options);
  workers_->Pause();
  GenerateParams a = Params({5, 6}, 3);
  a.request_id = "a";
  auto sink_a = std::make_shared<RecordingSink>();
  ASSERT_EQ(*engine_->Submit(a, sink_a), "a");
  // "a" runs (its first step is in flight); "b" waits; "c" finds the queue
  // full.
  ASSERT_TRUE(workers_->AwaitPausedStep(kWait));
  EXPECT_EQ(
      engine_->Submit(a, std::make_shared<RecordingSink>()).status().code(),
      absl::StatusCode::kAlreadyExists);
  auto sink_b = std::make_shared<RecordingSink>();
  absl::StatusOr<std::string> b = engine_->Submit(Params({8}, 2), sink_b);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, "req-2");
  EXPECT_EQ(engine_->Submit(Params({9}, 2), std::make_shared<RecordingSink>())
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(engine_->loads().running, 1);
  EXPECT_EQ(engine_->loads().waiting, 1);
  workers_->Resume();
  ASSERT_TRUE(sink_a->AwaitFinish());
  ASSERT_TRUE(sink_b->AwaitFinish());
  EXPECT_EQ(sink_a->tokens(), Expected(2, 3));
  EXPECT_EQ(sink_b->tokens(), Expected(1, 2));
}

TEST_P(EngineTest, SubmitAllIsAllOrNone) {
  EngineOptions options;
  options.scheduler.max_num_seqs = 1;
  options.scheduler.max_queued_requests = 2;
  Start(options);
  workers_->Pause();
  auto sink_a = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine_->Submit(Params({5, 6}, 2), sink_a).ok());
  ASSERT_TRUE(workers_->AwaitPausedStep(kWait));
  // Room for two waiting requests: three are refused together, and none of
  // them stays queued or hears anything.
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  std::vector<std::shared_ptr<GenerateSink>> as_sinks;
  std::vector<GenerateParams> params;
  for (int i = 0; i < 3; ++i) {
    sinks.push_back(std::make_shared<RecordingSink>());
    as_sinks.push_back(sinks.back());
    params.push_back(Params({7}, 2));
    params.back().request_id = absl::StrCat("choice-", i);
  }
  EXPECT_EQ(engine_->SubmitAll(params, as_sinks).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(engine_->loads().waiting, 0);
  EXPECT_EQ(engine_->Abort("choice-0").code(), absl::StatusCode::kNotFound);
  // Two fit, and both run.
  params.pop_back();
  as_sinks.pop_back();
  absl::StatusOr<std::vector<std::string>> ids =
      engine_->SubmitAll(params, as_sinks);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<std::string>{"choice-0", "choice-1"}));
  EXPECT_EQ(engine_->loads().waiting, 2);
  workers_->Resume();
  ASSERT_TRUE(sink_a->AwaitFinish());
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(sinks[i]->AwaitFinish());
    EXPECT_EQ(sinks[i]->tokens(), Expected(1, 2));
  }
  EXPECT_FALSE(sinks[2]->finished());
}

TEST_P(EngineTest, AbortFinishesAtOnceAndReleasesTheSequence) {
  workers_->Pause();
  auto sink = std::make_shared<RecordingSink>();
  absl::StatusOr<std::string> id =
      engine_->Submit(Params({5, 6, 7}, 100), sink);
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(workers_->AwaitPausedStep(kWait));
  const uint64_t sequence = workers_->steps()[0].chunks(0).sequence_id();
  ASSERT_TRUE(engine_->Abort(*id).ok());
  // Finished while its step is still in flight.
  ASSERT_TRUE(sink->finished());
  EXPECT_TRUE(sink->status().ok());
  EXPECT_EQ(sink->end(), GenerateEnd::kAbort);
  EXPECT_THAT(sink->tokens(), IsEmpty());
  EXPECT_EQ(sink->completion_tokens(), 0);
  EXPECT_EQ(engine_->Abort(*id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_->Abort("nobody").code(), absl::StatusCode::kNotFound);
  workers_->Resume();
  // The next step tells the workers to forget it.
  ASSERT_TRUE(workers_->AwaitSteps(2, kWait));
  const std::vector<worker::v1::StepRequest> steps = workers_->steps();
  EXPECT_THAT(steps[1].release_sequence_ids(), ElementsAre(sequence));
  EXPECT_THAT(steps[1].chunks(), IsEmpty());
  // Its late result went nowhere.
  EXPECT_THAT(sink->tokens(), IsEmpty());
}

TEST_P(EngineTest, AbortWhileWaiting) {
  EngineOptions options;
  options.scheduler.max_num_seqs = 1;
  Start(options);
  workers_->Pause();
  auto running = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine_->Submit(Params({5}, 2), running).ok());
  ASSERT_TRUE(workers_->AwaitPausedStep(kWait));
  GenerateParams p = Params({6}, 2);
  p.request_id = "queued";
  auto queued = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine_->Submit(p, queued).ok());
  ASSERT_TRUE(engine_->Abort("queued").ok());
  EXPECT_TRUE(queued->finished());
  EXPECT_EQ(queued->end(), GenerateEnd::kAbort);
  EXPECT_EQ(engine_->loads().waiting, 0);
  workers_->Resume();
  ASSERT_TRUE(running->AwaitFinish());
  EXPECT_EQ(running->tokens(), Expected(1, 2));
  EXPECT_THAT(queued->tokens(), IsEmpty());
}

// A step that fails on the workers reaches the request as `want`; OK when
// the group was lost: the request is recomputed once it is back.
struct FailureCase {
  absl::Status worker_error;
  absl::StatusCode want;
  bool pipelined = false;
};

class EngineFailureTest : public EngineFixture,
                          public ::testing::WithParamInterface<FailureCase> {
 protected:
  bool Pipelined() const override { return GetParam().pipelined; }
};

TEST_P(EngineFailureTest, WorkerFailureReachesTheCaller) {
  const FailureCase& c = GetParam();
  auto survivor = Run(Params({5}, 1));
  ASSERT_EQ(survivor->tokens().size(), 1u);
  // Its step, then the step that releases it: the failure hits the next.
  ASSERT_TRUE(workers_->AwaitStepsAnswered(2, kWait));
  workers_->FailNextSteps(c.worker_error);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine_->Submit(Params({5, 6, 7}, 4), sink).ok());
  ASSERT_TRUE(sink->AwaitFinish());
  EXPECT_EQ(sink->status().code(), c.want) << sink->status();
  if (c.want == absl::StatusCode::kOk) {
    EXPECT_EQ(sink->tokens(), Expected(3, 4));
    EXPECT_EQ(sink->end(), GenerateEnd::kLength);
  } else {
    EXPECT_EQ(sink->end(), GenerateEnd::kAbort);
    EXPECT_THAT(sink->tokens(), IsEmpty());
  }
  // Ready again once the workers answer (at once for a refused plan).
  ASSERT_TRUE(engine_->AwaitReady(kWait));
  EXPECT_EQ(Run(Params({5, 6, 7}, 2))->tokens(), Expected(3, 2));
}

INSTANTIATE_TEST_SUITE_P(
    Codes, EngineFailureTest,
    ::testing::Values(
        FailureCase{absl::UnavailableError("worker 1 (h:1): connection lost"),
                    absl::StatusCode::kOk},
        FailureCase{absl::DeadlineExceededError("worker 0 (h:0): deadline"),
                    absl::StatusCode::kOk},
        FailureCase{absl::ResourceExhaustedError("worker 0: KV cache full"),
                    absl::StatusCode::kResourceExhausted},
        FailureCase{absl::InvalidArgumentError("worker 0: bad plan"),
                    absl::StatusCode::kInternal},
        FailureCase{absl::UnavailableError("worker 1 (h:1): connection lost"),
                    absl::StatusCode::kOk, /*pipelined=*/true},
        FailureCase{absl::ResourceExhaustedError("worker 0: KV cache full"),
                    absl::StatusCode::kResourceExhausted, /*pipelined=*/true},
        FailureCase{absl::InvalidArgumentError("worker 0: bad plan"),
                    absl::StatusCode::kInternal, /*pipelined=*/true}));

// A step every rank reports as not run (an Engram store fault) fails its
// requests with UNAVAILABLE; the group is intact, so the engine stays ready
// and does not wait for the workers to answer again.
TEST_P(EngineTest, StepNotRunFailsItsRequestsAndTheEngineStaysReady) {
  workers_->FailNextSteps(StepNotRunError(
      "worker 0 (h:0): the step did not run, an Engram lookup failed"));
  // A lost group could not become ready again while Info() fails.
  workers_->SetInfoStatus(absl::UnavailableError("worker 0 unreachable"));
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine_->Submit(Params({5, 6, 7}, 4), sink).ok());
  ASSERT_TRUE(sink->AwaitFinish());
  EXPECT_EQ(sink->status().code(), absl::StatusCode::kUnavailable)
      << sink->status();
  EXPECT_THAT(std::string(sink->status().message()),
              HasSubstr("an Engram lookup failed"));
  EXPECT_EQ(sink->end(), GenerateEnd::kAbort);
  EXPECT_TRUE(engine_->ready());
  EXPECT_EQ(Run(Params({5, 6, 7}, 2))->tokens(), Expected(3, 2));
  workers_->SetInfoStatus(absl::OkStatus());
}

// A lost group: the engine is not ready and refuses new requests until the
// workers answer again; the request that was running waits and is
// recomputed, so its client gets every token.
TEST_P(EngineTest, LostGroupMakesTheEngineNotReadyUntilTheWorkersAnswer) {
  workers_->FailNextSteps(absl::UnavailableError("worker 0: gone"));
  workers_->Pause();
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine_->Submit(Params({5}, 4), sink).ok());
  ASSERT_TRUE(workers_->AwaitPausedStep(kWait));
  // The worker does not come back at once.
  workers_->SetInfoStatus(absl::UnavailableError("worker 0 restarting"));
  workers_->Resume();
  const absl::Time give_up = absl::Now() + kWait;
  while (engine_->ready() && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_FALSE(engine_->ready());
  EXPECT_EQ(engine_->Submit(Params({5}, 1), std::make_shared<RecordingSink>())
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(engine_->loads().waiting, 1);
  workers_->SetInfoStatus(absl::OkStatus());
  ASSERT_TRUE(engine_->AwaitReady(kWait));
  ASSERT_TRUE(sink->AwaitFinish());
  EXPECT_TRUE(sink->status().ok()) << sink->status();
  EXPECT_EQ(sink->tokens(), Expected(1, 4));
  EXPECT_EQ(Run(Params({5}, 1))->tokens(), Expected(1, 1));
}

// A request whose worker state is lost again and again (it may be what
// kills the workers) fails with UNAVAILABLE after kMaxRecoveries
// recomputations.
TEST_P(EngineTest, ARequestLostTooOftenFails) {
  workers_->FailNextSteps(absl::UnavailableError("worker 0: gone"),
                          kMaxRecoveries + 1);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine_->Submit(Params({5}, 4), sink).ok());
  ASSERT_TRUE(sink->AwaitFinish());
  EXPECT_EQ(sink->status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(sink->status().message()),
              HasSubstr("lost its worker state"));
  EXPECT_EQ(sink->end(), GenerateEnd::kAbort);
  ASSERT_TRUE(engine_->AwaitReady(kWait));
  EXPECT_EQ(Run(Params({5}, 2))->tokens(), Expected(1, 2));
}

// Workers of a TP group start out of a group: the engine forms generation 1
// before it is ready.
TEST_P(EngineTest, FormsTheGroupBeforeItIsReady) {
  FakeWorkerGroupOptions fake;
  fake.size = 2;
  Start(EngineOptions(), fake);
  EXPECT_EQ(workers_->joins(), std::vector<int64_t>({1}));
  EXPECT_EQ(Run(Params({5, 6}, 2))->tokens(), Expected(2, 2));
}

// A rank restarted while idle reports no group: the idle check notices and
// the engine re-forms the group in a new generation, without failing
// anything (nothing was running).
TEST_P(EngineTest, ReformsTheGroupWhenARankRestartsWhileIdle) {
  FakeWorkerGroupOptions fake;
  fake.size = 2;
  EngineOptions options;
  options.idle_check_interval = absl::Milliseconds(5);
  Start(options, fake);
  workers_->SetOutOfGroup(1);
  const absl::Time give_up = absl::Now() + kWait;
  while (workers_->joins().size() < 2 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_EQ(workers_->joins(), std::vector<int64_t>({1, 2}));
  ASSERT_TRUE(engine_->AwaitReady(kWait));
  EXPECT_EQ(Run(Params({5}, 3))->tokens(), Expected(1, 3));
}

// A rank out of its group mid-request: the step fails, the group is
// re-formed (a failed re-forming is retried with a newer generation), and
// both the running request (recomputed) and the waiting one complete.
TEST_P(EngineTest, LostRankRequeuesRunningRequestsAndTheGroupHeals) {
  FakeWorkerGroupOptions fake;
  fake.size = 2;
  EngineOptions options;
  options.scheduler.max_num_seqs = 1;
  Start(options, fake);
  workers_->Pause();
  auto running = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine_->Submit(Params({5}, 4), running).ok());
  ASSERT_TRUE(workers_->AwaitPausedStep(kWait));
  auto waiting = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine_->Submit(Params({7, 8}, 2), waiting).ok());
  workers_->SetOutOfGroup(0);
  workers_->FailNextJoins(absl::DeadlineExceededError("rank 1 never came"));
  workers_->Resume();
  ASSERT_TRUE(running->AwaitFinish());
  EXPECT_TRUE(running->status().ok()) << running->status();
  EXPECT_EQ(running->tokens(), Expected(1, 4));
  ASSERT_TRUE(waiting->AwaitFinish());
  EXPECT_TRUE(waiting->status().ok()) << waiting->status();
  EXPECT_EQ(waiting->tokens(), Expected(2, 2));
  EXPECT_EQ(workers_->joins(), std::vector<int64_t>({1, 2, 3}));
  EXPECT_TRUE(engine_->ready());
}

TEST_P(EngineTest, StopFailsLiveRequestsWithUnavailable) {
  workers_->Pause();
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine_->Submit(Params({5}, 10), sink).ok());
  ASSERT_TRUE(workers_->AwaitPausedStep(kWait));
  // Stop while the step is in flight: the loop ends after it.
  std::thread stopper([this] { engine_->Stop(); });
  const absl::Time deadline = absl::Now() + kWait;
  while (engine_->alive() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_FALSE(engine_->alive());
  workers_->Resume();
  stopper.join();
  ASSERT_TRUE(sink->finished());
  EXPECT_EQ(sink->status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(engine_->Submit(Params({5}, 1), std::make_shared<RecordingSink>())
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
}

// The steps the fake received that ran chunks (not only releases).
std::vector<worker::v1::StepRequest> ChunkSteps(const FakeWorkerGroup& w) {
  std::vector<worker::v1::StepRequest> out;
  for (worker::v1::StepRequest& s : w.steps()) {
    if (s.chunks_size() > 0) out.push_back(std::move(s));
  }
  return out;
}

std::vector<int64_t> Range(int64_t first, int64_t n) {
  std::vector<int64_t> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = first + i;
  return out;
}

// The prompt entries the fake's values give: entry i >= 1 from position
// i - 1, top N of FakeTopId(k) at PromptLogprob - k.
void ExpectPromptLogprobs(const std::vector<TokenLogprobs>& got,
                          const std::vector<int64_t>& prompt, int n) {
  ASSERT_EQ(got.size(), prompt.size());
  EXPECT_EQ(got[0].token_id, prompt[0]);
  EXPECT_FALSE(got[0].logprob.has_value());
  EXPECT_THAT(got[0].top.token_ids, IsEmpty());
  for (size_t i = 1; i < prompt.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("prompt entry ", i));
    EXPECT_EQ(got[i].token_id, prompt[i]);
    ASSERT_TRUE(got[i].logprob.has_value());
    const float lp =
        FakeWorkerGroup::PromptLogprob(static_cast<int64_t>(i) - 1);
    EXPECT_EQ(*got[i].logprob, lp);  // Never NaN: the next token was known.
    ASSERT_EQ(got[i].top.token_ids.size(), static_cast<size_t>(n));
    ASSERT_EQ(got[i].top.logprobs.size(), static_cast<size_t>(n));
    for (int k = 0; k < n; ++k) {
      EXPECT_EQ(got[i].top.token_ids[k], FakeWorkerGroup::FakeTopId(k));
      EXPECT_EQ(got[i].top.logprobs[k], lp - static_cast<float>(k));
    }
  }
}

TEST_P(EngineTest, PromptAndTopLogprobsInOrderAcrossChunks) {
  EngineOptions o;
  o.scheduler.long_prefill_token_threshold = 4;
  Start(o);
  const std::vector<int64_t> prompt = Range(20, 11);
  GenerateParams p = Params(prompt, 3);
  p.logprobs = true;
  p.top_logprobs = 3;
  p.prompt_logprobs = 2;
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine_->Submit(p, sink).ok());
  ASSERT_TRUE(sink->AwaitFinish());
  EXPECT_TRUE(sink->status().ok()) << sink->status();
  EXPECT_THAT(sink->events(), ElementsAre("prompt", "top", "tokens", "top",
                                          "tokens", "top", "tokens", "finish"));
  ExpectPromptLogprobs(sink->prompt(), prompt, 2);
  EXPECT_EQ(sink->tokens(), Expected(11, 3));
  EXPECT_THAT(sink->logprobs(), ElementsAre(-0.5f, -0.5f, -0.5f));
  const std::vector<TopLogprobs> tops = sink->tops();
  ASSERT_EQ(tops.size(), 3u);
  for (size_t i = 0; i < tops.size(); ++i) {
    EXPECT_THAT(tops[i].token_ids,
                ElementsAre(Expected(11, 3)[i], FakeWorkerGroup::FakeTopId(1),
                            FakeWorkerGroup::FakeTopId(2)));
    EXPECT_THAT(tops[i].logprobs, ElementsAre(-0.5f, -1.5f, -2.5f));
  }
  // Prefill chunks of 4, 4 and 3 tokens ask for prompt logprobs with the
  // next chunk's first token; the decodes only for the sampled top 3.
  const std::vector<worker::v1::StepRequest> steps = ChunkSteps(*workers_);
  ASSERT_EQ(steps.size(), 5u);
  const worker::v1::SequenceChunk& c0 = steps[0].chunks(0);
  const worker::v1::SequenceChunk& c1 = steps[1].chunks(0);
  const worker::v1::SequenceChunk& c2 = steps[2].chunks(0);
  EXPECT_TRUE(c0.prompt_logprobs() && c1.prompt_logprobs() &&
              c2.prompt_logprobs());
  EXPECT_EQ(c0.next_token_id(), prompt[4]);
  EXPECT_EQ(c1.next_token_id(), prompt[8]);
  EXPECT_FALSE(c2.has_next_token_id());
  EXPECT_EQ(c0.top_logprobs(), 2);
  EXPECT_EQ(c2.top_logprobs(), 3);  // The larger of the two N.
  EXPECT_EQ(c2.output(), worker::v1::OUTPUT_SAMPLE);
  for (size_t i = 3; i < steps.size(); ++i) {
    EXPECT_FALSE(steps[i].chunks(0).prompt_logprobs());
    EXPECT_EQ(steps[i].chunks(0).top_logprobs(), 3);
  }
}

TEST_P(EngineTest, LogprobEventsOnlyWhenAsked) {
  auto plain = std::make_shared<RecordingSink>();
  GenerateParams p = Params({5, 6, 7}, 2);
  p.logprobs = true;  // Logprobs without alternatives.
  ASSERT_TRUE(engine_->Submit(p, plain).ok());
  ASSERT_TRUE(plain->AwaitFinish());
  EXPECT_THAT(plain->events(), ElementsAre("tokens", "tokens", "finish"));
  for (const worker::v1::StepRequest& s : ChunkSteps(*workers_)) {
    EXPECT_FALSE(s.chunks(0).prompt_logprobs());
    EXPECT_EQ(s.chunks(0).top_logprobs(), 0);
  }
  // A one-token prompt: its only entry has no logprob, and the workers are
  // not asked for any.
  auto one = std::make_shared<RecordingSink>();
  p = Params({9}, 1);
  p.prompt_logprobs = 5;
  ASSERT_TRUE(engine_->Submit(p, one).ok());
  ASSERT_TRUE(one->AwaitFinish());
  EXPECT_THAT(one->events(), ElementsAre("prompt", "tokens", "finish"));
  ExpectPromptLogprobs(one->prompt(), {9}, 5);
  EXPECT_FALSE(ChunkSteps(*workers_).back().chunks(0).prompt_logprobs());
}

TEST_P(EngineTest, PromptLogprobsOnceThroughPreemptions) {
  // 20 blocks of 16 tokens; prefills of 16 tokens a step. A (200 + 50)
  // outgrows the pool while B (150 + 40) prefills: B is preempted mid-
  // prefill (and later in its decode) and recomputed from position 0.
  EngineOptions o;
  o.scheduler.long_prefill_token_threshold = 16;
  FakeWorkerGroupOptions fake;
  fake.kv_bytes_total = int64_t{20} * 16 * 16;
  Start(o, fake);
  const std::vector<int64_t> prompt_a = Range(200, 200);
  const std::vector<int64_t> prompt_b = Range(500, 150);
  auto a = std::make_shared<RecordingSink>();
  auto b = std::make_shared<RecordingSink>();
  GenerateParams pa = Params(prompt_a, 50);
  pa.prompt_logprobs = 1;
  GenerateParams pb = Params(prompt_b, 40);
  pb.prompt_logprobs = 0;
  // Queued together, so that A cannot finish before B arrives.
  ASSERT_TRUE(engine_->SubmitAll({pa, pb}, {a, b}).ok());
  ASSERT_TRUE(a->AwaitFinish());
  ASSERT_TRUE(b->AwaitFinish());
  ASSERT_GT(engine_->loads().preemptions, 0);
  EXPECT_TRUE(a->status().ok()) << a->status();
  EXPECT_TRUE(b->status().ok()) << b->status();
  // B restarted from position 0 at least once.
  int b_starts = 0;
  for (const worker::v1::StepRequest& s : workers_->steps()) {
    for (const worker::v1::SequenceChunk& c : s.chunks()) {
      if (c.start_position() == 0 && c.token_ids(0) == prompt_b[0]) ++b_starts;
    }
  }
  EXPECT_GE(b_starts, 2);
  for (const auto& [sink, prompt, n] :
       {std::make_tuple(a, prompt_a, 1), std::make_tuple(b, prompt_b, 0)}) {
    const std::vector<std::string> events = sink->events();
    EXPECT_EQ(std::count(events.begin(), events.end(), "prompt"), 1);
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.front(), "prompt");
    ExpectPromptLogprobs(sink->prompt(), prompt, n);
    EXPECT_EQ(sink->tokens(), Expected(static_cast<int>(prompt.size()),
                                       prompt == prompt_a ? 50 : 40));
  }
}

INSTANTIATE_TEST_SUITE_P(StepPaths, EngineTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Overlapped" : "OneByOne";
                         });

// ---------------------------------------------------------------------------
// Overlap scheduling

class OverlapTest : public EngineFixture {
 protected:
  bool Pipelined() const override { return true; }

  // The chunks of the recorded steps that start with a sampled token.
  std::vector<worker::v1::SequenceChunk> AheadChunks() const {
    std::vector<worker::v1::SequenceChunk> out;
    for (const worker::v1::StepRequest& step : workers_->steps()) {
      for (const worker::v1::SequenceChunk& c : step.chunks()) {
        if (c.starts_with_sampled_token()) out.push_back(c);
      }
    }
    return out;
  }
};

// In the steady state every decode is planned while the one before runs:
// its chunk names no token (the workers start it with the token they just
// sampled), its position and seed are those of the next token, and the
// requests get the tokens, log-probabilities and ends they get one step at
// a time.
TEST_F(OverlapTest, DecodesArePlannedAheadWithTheSameResults) {
  GenerateParams a = Params({5, 6, 7}, 12);
  a.sampling.set_seed(1000);
  a.logprobs = true;
  GenerateParams b = Params({9, 9}, 7);
  b.sampling.set_seed(2000);
  auto sa = std::make_shared<RecordingSink>();
  auto sb = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine_->SubmitAll({a, b}, {sa, sb}).ok());
  ASSERT_TRUE(sa->AwaitFinish());
  ASSERT_TRUE(sb->AwaitFinish());
  EXPECT_EQ(sa->tokens(), Expected(3, 12));
  EXPECT_EQ(sa->logprobs(), std::vector<float>(12, -0.5f));
  EXPECT_EQ(sa->end(), GenerateEnd::kLength);
  EXPECT_EQ(sb->tokens(), Expected(2, 7));
  EXPECT_EQ(sb->completion_tokens(), 7);
  const std::vector<worker::v1::SequenceChunk> ahead = AheadChunks();
  // Every decode but the first of each request (planned after the prompt's
  // results) and those after a request's last: 10 + 5.
  EXPECT_GE(ahead.size(), 10u);
  for (const worker::v1::SequenceChunk& c : ahead) {
    EXPECT_THAT(c.token_ids(), IsEmpty());
    const bool is_a = c.start_position() >= 3 && c.sampling().seed() >= 1000 &&
                      c.sampling().seed() < 2000;
    // Token i of a request is at position prompt + i, drawn with seed + i.
    const int64_t prompt = is_a ? 3 : 2;
    const uint64_t base = is_a ? 1000 : 2000;
    EXPECT_EQ(c.sampling().seed(),
              base + static_cast<uint64_t>(c.start_position() - prompt + 1));
  }
}

// A request that stops in a step with the next one already sent: the
// decode planned ahead is computed in vain, the request ends with the stop
// token, and the next step releases it.
TEST_F(OverlapTest, StopWhileTheNextStepIsInFlight) {
  // The fourth new token (position 6) is eos.
  workers_->SetTokenRule([](uint64_t, int64_t position) -> int64_t {
    return position == 6 ? 1 : FakeWorkerGroup::DefaultToken(0, position);
  });
  std::shared_ptr<RecordingSink> sink = Run(Params({5, 6, 7}, 20));
  EXPECT_EQ(sink->end(), GenerateEnd::kStop);
  EXPECT_THAT(sink->tokens(), ElementsAre(103, 104, 105, 1));
  // The decode after eos was sent (position 6: eos's own) and its result
  // dropped.
  bool computed_in_vain = false;
  for (const worker::v1::SequenceChunk& c : AheadChunks()) {
    computed_in_vain = computed_in_vain || c.start_position() == 6;
  }
  EXPECT_TRUE(computed_in_vain);
  ASSERT_TRUE(workers_->AwaitStepsAnswered(
      static_cast<int>(workers_->steps().size()), kWait));
  EXPECT_EQ(Run(Params({5, 6, 7}, 2))->tokens(), Expected(3, 2));
  bool released = false;
  for (const worker::v1::StepRequest& step : workers_->steps()) {
    released = released || !step.release_sequence_ids().empty();
  }
  EXPECT_TRUE(released);
}

// A step fails while the decode after it was already sent: a refused step
// fails its request (the step planned ahead, refused by the workers as its
// token was never sampled, changes nothing more); a lost group recomputes
// the request, which still gets every token once.
TEST_F(OverlapTest, FailureWhileTheNextStepIsInFlight) {
  for (const absl::Status& error :
       {absl::ResourceExhaustedError("worker 0: KV cache full"),
        absl::UnavailableError("worker 0 (h:0): connection lost")}) {
    SCOPED_TRACE(error.ToString());
    auto sink = std::make_shared<RecordingSink>();
    // Paused before its fifth step runs (the prompt, then decodes).
    workers_->PauseAt(workers_->num_answered() + 5);
    ASSERT_TRUE(engine_->Submit(Params({5, 6, 7}, 40), sink).ok());
    ASSERT_TRUE(workers_->AwaitPausedStep(kWait));
    // Paused in a decode whose successor was sent before it ran.
    ASSERT_TRUE(workers_->steps().back().chunks_size() == 1 &&
                workers_->steps().back().chunks(0).starts_with_sampled_token());
    workers_->FailNextSteps(error);
    workers_->Resume();
    ASSERT_TRUE(sink->AwaitFinish());
    if (error.code() == absl::StatusCode::kResourceExhausted) {
      EXPECT_EQ(sink->status().code(), absl::StatusCode::kResourceExhausted);
      EXPECT_EQ(sink->end(), GenerateEnd::kAbort);
      EXPECT_LT(sink->tokens().size(), 40u);
      const std::vector<int64_t> got = sink->tokens();
      EXPECT_EQ(got, Expected(3, static_cast<int>(got.size())));
    } else {
      EXPECT_TRUE(sink->status().ok()) << sink->status();
      EXPECT_EQ(sink->tokens(), Expected(3, 40));
    }
    ASSERT_TRUE(engine_->AwaitReady(kWait));
    EXPECT_EQ(Run(Params({5, 6, 7}, 3))->tokens(), Expected(3, 3));
  }
}

TEST(EngineCreateTest, RefusesBadOptions) {
  FakeWorkerGroup workers;
  MetricsRegistry metrics;
  EXPECT_EQ(Engine::Create(EngineOptions(), nullptr, &metrics).status().code(),
            absl::StatusCode::kInvalidArgument);
  EngineOptions options;
  options.ready_poll_interval = absl::ZeroDuration();
  EXPECT_EQ(Engine::Create(options, &workers, &metrics).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = EngineOptions();
  options.max_prefetch_hints = -1;
  EXPECT_EQ(Engine::Create(options, &workers, &metrics).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mneme::coordinator
