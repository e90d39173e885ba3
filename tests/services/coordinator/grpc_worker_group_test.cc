// The gRPC worker group's step streams against fake workers on loopback: steps
// started back to back are answered in order over one stream per rank, a
// step's error comes back as its status and the stream goes on, and a stream
// that broke (a stalled step past its deadline, a worker that ended it) fails
// its steps with UNAVAILABLE and is opened again for the next step.

#include "services/coordinator/grpc_worker_group.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/worker/v1/worker.grpc.pb.h"
#include "services/coordinator/worker_group.h"

namespace mneme::coordinator {
namespace {

namespace v1 = worker::v1;
using ::testing::HasSubstr;

// What a fake worker does with a step, by its step_id.
constexpr uint64_t kStall = 7;      // Never answers (until cancelled).
constexpr uint64_t kEndStream = 8;  // Ends the stream with UNAVAILABLE.
constexpr uint64_t kRefuse = 9;     // INVALID_ARGUMENT.
constexpr uint64_t kNotRun = 10;    // UNAVAILABLE, step_not_run.
constexpr uint64_t kAstray = 14;    // Answered as another step.
constexpr uint64_t kDiverge = 15;   // Rank 1 samples other tokens.

// Answers each step with its step_id, the rank in compute_micros, and per
// chunk the token 1000 + sequence id.
class FakeWorker final : public v1::Worker::Service {
 public:
  explicit FakeWorker(int rank) : rank_(rank) {}

  grpc::Status Step(grpc::ServerContext* /*context*/,
                    const v1::StepRequest* request,
                    v1::StepResponse* response) override {
    ++unary_calls;
    Answer(*request, *response);
    return grpc::Status::OK;
  }

  void Answer(const v1::StepRequest& request, v1::StepResponse& response) {
    response.set_step_id(request.step_id());
    response.set_compute_micros(rank_);
    for (const v1::SequenceChunk& c : request.chunks()) {
      v1::ChunkResult* result = response.add_results();
      result->set_sequence_id(c.sequence_id());
      result->set_token_id(
          1000 + static_cast<int64_t>(c.sequence_id()) +
          (rank_ == 1 && request.step_id() == kDiverge ? 1 : 0));
    }
  }

  grpc::Status StepStream(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::StepStreamResponse, v1::StepRequest>* stream)
      override {
    ++streams;
    v1::StepRequest request;
    while (stream->Read(&request)) {
      v1::StepStreamResponse answer;
      answer.set_step_id(request.step_id());
      switch (request.step_id()) {
        case kStall:
          while (!context->IsCancelled()) {
            absl::SleepFor(absl::Milliseconds(5));
          }
          return grpc::Status::CANCELLED;
        case kEndStream:
          return grpc::Status(grpc::StatusCode::UNAVAILABLE, "restarting");
        case kRefuse:
          answer.set_code(grpc::StatusCode::INVALID_ARGUMENT);
          answer.set_message("bad plan");
          break;
        case kNotRun:
          answer.set_code(grpc::StatusCode::UNAVAILABLE);
          answer.set_message("engram store down");
          answer.set_details(std::string(kStepNotRunDetails));
          break;
        case kAstray:
          answer.set_step_id(request.step_id() + 1);
          break;
        default:
          Answer(request, *answer.mutable_response());
      }
      if (!stream->Write(answer)) break;
    }
    return grpc::Status::OK;
  }

  std::atomic<int> streams{0};
  std::atomic<int> unary_calls{0};

 private:
  const int rank_;
};

class GrpcWorkerGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int r = 0; r < 2; ++r) {
      workers_.push_back(std::make_unique<FakeWorker>(r));
      grpc::ServerBuilder builder;
      int port = 0;
      builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                               &port);
      builder.RegisterService(workers_.back().get());
      servers_.push_back(builder.BuildAndStart());
      ASSERT_NE(servers_.back(), nullptr);
      addresses_.push_back(absl::StrCat("127.0.0.1:", port));
    }
  }
  void TearDown() override {
    group_.reset();
    for (auto& s : servers_) s->Shutdown(absl::ToChronoTime(absl::Now()));
  }

  GrpcWorkerGroup& Group(bool stream, absl::Duration step_timeout) {
    GrpcWorkerGroupOptions o;
    o.workers = addresses_;
    o.step_stream = stream;
    o.step_timeout = step_timeout;
    absl::StatusOr<std::unique_ptr<GrpcWorkerGroup>> g =
        GrpcWorkerGroup::Create(o);
    EXPECT_TRUE(g.ok()) << g.status();
    group_ = *std::move(g);
    return *group_;
  }

  static v1::StepRequest StepNumber(uint64_t id) {
    v1::StepRequest r;
    r.set_step_id(id);
    return r;
  }

  std::vector<std::unique_ptr<FakeWorker>> workers_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
  std::vector<std::string> addresses_;
  std::unique_ptr<GrpcWorkerGroup> group_;
};

TEST_F(GrpcWorkerGroupTest, StepsStartedBackToBackAreAnsweredInOrder) {
  GrpcWorkerGroup& g = Group(/*stream=*/true, absl::Seconds(30));
  EXPECT_TRUE(g.pipelined());
  std::vector<std::unique_ptr<WorkerGroup::PendingStep>> pending;
  for (uint64_t id = 100; id < 110; ++id) {
    pending.push_back(g.StartStep(StepNumber(id)));
  }
  for (uint64_t id = 100; id < 110; ++id) {
    absl::StatusOr<v1::StepResponse> r = pending[id - 100]->Wait();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step_id(), id);
    EXPECT_EQ(r->compute_micros(), 0);  // Rank 0's answer.
  }
  EXPECT_TRUE(g.Step(StepNumber(200)).ok());
  // One stream per rank for all of them; no unary call.
  EXPECT_EQ(workers_[0]->streams, 1);
  EXPECT_EQ(workers_[1]->streams, 1);
  EXPECT_EQ(workers_[0]->unary_calls, 0);
}

TEST_F(GrpcWorkerGroupTest, AStepErrorIsItsStatusAndTheStreamGoesOn) {
  GrpcWorkerGroup& g = Group(/*stream=*/true, absl::Seconds(30));
  absl::StatusOr<v1::StepResponse> r = g.Step(StepNumber(kRefuse));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("worker 0"));
  EXPECT_THAT(r.status().message(), HasSubstr("bad plan"));
  r = g.Step(StepNumber(kNotRun));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(IsStepNotRun(r.status())) << r.status();
  r = g.Step(StepNumber(11));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step_id(), 11u);
  EXPECT_EQ(workers_[0]->streams, 1);
}

TEST_F(GrpcWorkerGroupTest, AStalledStepBreaksItsStreamWhichIsOpenedAgain) {
  GrpcWorkerGroup& g = Group(/*stream=*/true, absl::Milliseconds(300));
  std::unique_ptr<WorkerGroup::PendingStep> stalled =
      g.StartStep(StepNumber(kStall));
  // Queued behind it on the same stream: lost with it.
  std::unique_ptr<WorkerGroup::PendingStep> behind =
      g.StartStep(StepNumber(12));
  absl::StatusOr<v1::StepResponse> r = stalled->Wait();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("deadline"));
  EXPECT_EQ(behind->Wait().status().code(), absl::StatusCode::kUnavailable);
  r = g.Step(StepNumber(13));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step_id(), 13u);
  EXPECT_EQ(workers_[0]->streams, 2);
}

TEST_F(GrpcWorkerGroupTest, AStreamTheWorkerEndsFailsItsStepsAndReopens) {
  GrpcWorkerGroup& g = Group(/*stream=*/true, absl::Seconds(30));
  ASSERT_TRUE(g.Step(StepNumber(1)).ok());
  absl::StatusOr<v1::StepResponse> r = g.Step(StepNumber(kEndStream));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr("restarting"));
  r = g.Step(StepNumber(2));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(workers_[0]->streams, 2);
}

TEST_F(GrpcWorkerGroupTest, AnAnswerToAnotherStepBreaksTheStream) {
  GrpcWorkerGroup& g = Group(/*stream=*/true, absl::Seconds(30));
  absl::StatusOr<v1::StepResponse> r = g.Step(StepNumber(kAstray));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("the answer to step 15"));
  r = g.Step(StepNumber(16));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(workers_[0]->streams, 2);
}

// A step started and dropped without Wait: its answers must not be taken for
// the next step's.
TEST_F(GrpcWorkerGroupTest, AStepNeverWaitedForBreaksItsStreams) {
  GrpcWorkerGroup& g = Group(/*stream=*/true, absl::Seconds(30));
  g.StartStep(StepNumber(17)).reset();
  absl::StatusOr<v1::StepResponse> r = g.Step(StepNumber(18));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step_id(), 18u);
}

TEST_F(GrpcWorkerGroupTest, AWorkerThatIsGoneIsUnavailable) {
  GrpcWorkerGroup& g = Group(/*stream=*/true, absl::Seconds(5));
  ASSERT_TRUE(g.Step(StepNumber(1)).ok());
  servers_[1]->Shutdown(absl::ToChronoTime(absl::Now()));
  absl::StatusOr<v1::StepResponse> r = g.Step(StepNumber(2));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("worker 1"));
}

// Every rank starts its next chunks with the tokens it sampled: a rank that
// sampled others is out of step, on either step path.
TEST_F(GrpcWorkerGroupTest, RanksThatSampledOtherTokensAreDataLoss) {
  for (bool stream : {true, false}) {
    SCOPED_TRACE(stream ? "StepStream" : "unary Step");
    GrpcWorkerGroup& g = Group(stream, absl::Seconds(30));
    v1::StepRequest request = StepNumber(kDiverge);
    request.add_chunks()->set_sequence_id(4);
    request.add_chunks()->set_sequence_id(9);
    absl::StatusOr<v1::StepResponse> r = g.Step(request);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("worker 1"));
    EXPECT_THAT(r.status().message(), HasSubstr("token 1005 vs 1004"));
    // The same tokens on every rank: rank 0's answer.
    request.set_step_id(16);
    r = g.Step(request);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->results_size(), 2);
    EXPECT_EQ(r->results(1).token_id(), 1009);
  }
}

TEST_F(GrpcWorkerGroupTest, UnaryStepsWithoutTheStream) {
  GrpcWorkerGroup& g = Group(/*stream=*/false, absl::Seconds(30));
  EXPECT_FALSE(g.pipelined());
  absl::StatusOr<v1::StepResponse> r = g.StartStep(StepNumber(5))->Wait();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step_id(), 5u);
  EXPECT_EQ(workers_[0]->unary_calls, 1);
  EXPECT_EQ(workers_[1]->unary_calls, 1);
  EXPECT_EQ(workers_[0]->streams, 0);
}

}  // namespace
}  // namespace mneme::coordinator
