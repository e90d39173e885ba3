#include "services/coordinator/grpc_worker_group.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/time/clock.h"
#include "common/grpc_channel.h"
#include "common/grpc_status.h"
#include "common/host_port.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"

namespace mneme::coordinator {
namespace {

namespace v1 = worker::v1;

// Starts `call(rank, context, on_done)` on every rank at once, each context
// with a deadline `timeout` from now; waits for all and returns the ranks'
// statuses.
template <typename Call>
std::vector<grpc::Status> CallEveryRank(int n, absl::Duration timeout,
                                        Call call) {
  std::vector<grpc::ClientContext> contexts(n);
  std::vector<grpc::Status> statuses(n);
  absl::BlockingCounter done(n);
  const auto deadline = absl::ToChronoTime(absl::Now() + timeout);
  for (int r = 0; r < n; ++r) {
    contexts[r].set_deadline(deadline);
    call(r, &contexts[r], [&statuses, &done, r](grpc::Status s) {
      statuses[r] = std::move(s);
      done.DecrementCount();
    });
  }
  done.Wait();
  return statuses;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcWorkerGroup>> GrpcWorkerGroup::Create(
    const GrpcWorkerGroupOptions& options) {
  if (options.workers.empty()) {
    return absl::InvalidArgumentError("the worker list is empty");
  }
  if (options.step_timeout <= absl::ZeroDuration() ||
      options.control_timeout <= absl::ZeroDuration() ||
      options.join_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("worker timeouts must be positive");
  }
  std::unique_ptr<GrpcWorkerGroup> group(new GrpcWorkerGroup(options));
  for (size_t r = 0; r < options.workers.size(); ++r) {
    const std::string& address = options.workers[r];
    RETURN_IF_ERROR(
        ParseHostPort(address, absl::StrCat("worker ", r)).status());
    ClientChannelOptions channel_options;
    channel_options.tls = options.tls;
    channel_options.cluster_secret_file = options.cluster_secret_file;
    ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                     CreateClientChannel(address, channel_options));
    group->stubs_.push_back(v1::Worker::NewStub(channel));
  }
  return group;
}

// One rank's StepStream. Send() queues a step for writing (in order);
// Next() waits for the following answer. Once the stream ended (the worker
// closed it, the connection broke, or a step missed its deadline, which
// cancels the stream) it is broken: every later Next() fails, and the group
// opens a new one for the next step. A hold keeps the call alive while a
// write may still be started from outside its reactions; the destructor
// cancels the call and waits for its end.
class GrpcWorkerGroup::RankStream final
    : public grpc::ClientBidiReactor<v1::StepRequest, v1::StepStreamResponse> {
 public:
  explicit RankStream(v1::Worker::Stub* stub) {
    stub->async()->StepStream(&context_, this);
    AddHold();
    StartRead(&incoming_);
    StartCall();
  }
  ~RankStream() override {
    context_.TryCancel();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
  }
  RankStream(const RankStream&) = delete;
  RankStream& operator=(const RankStream&) = delete;

  bool broken() const {
    absl::MutexLock lock(&mu_);
    return broken_ || ended_;
  }

  // Gives the stream up (an answer went astray): every later Next() fails.
  void Break() {
    {
      absl::MutexLock lock(&mu_);
      broken_ = true;
    }
    context_.TryCancel();
  }

  void Send(const v1::StepRequest& request) {
    const v1::StepRequest* write = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (broken_ || ended_) return;  // Next() reports it.
      writes_.push_back(request);
      if (!writing_) {
        writing_ = true;
        write = &writes_.back();
      }
    }
    if (write != nullptr) StartWrite(write);
  }

  // The next answer, or the error that ended the stream (deadline: the
  // stream is cancelled).
  absl::StatusOr<v1::StepStreamResponse> Next(absl::Time deadline) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithDeadline(absl::Condition(this, &RankStream::Answered),
                                deadline)) {
        return TakeAnswerLocked();
      }
      broken_ = true;
    }
    context_.TryCancel();
    return absl::DeadlineExceededError("the step missed its deadline");
  }

  absl::StatusOr<v1::StepStreamResponse> TakeAnswerLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (broken_) {
      // Answers arriving after a step missed its deadline are not trusted.
      return absl::UnavailableError(
          "the step stream was cancelled after a step missed its deadline");
    }
    if (!answers_.empty()) {
      v1::StepStreamResponse answer = std::move(answers_.front());
      answers_.pop_front();
      return answer;
    }
    if (done_ && !status_.ok()) {
      return absl::UnavailableError(
          absl::StrCat("the step stream ended: ", status_.error_message()));
    }
    return absl::UnavailableError("the step stream ended");
  }

  void OnWriteDone(bool ok) override {
    const v1::StepRequest* next = nullptr;
    bool release = false;
    {
      absl::MutexLock lock(&mu_);
      writes_.pop_front();
      if (!ok) {
        ended_ = true;  // The read fails too.
        writes_.clear();
      }
      writing_ = !writes_.empty();
      if (writing_) next = &writes_.front();
      release = ReleaseLocked();
    }
    if (next != nullptr) StartWrite(next);
    if (release) RemoveHold();
  }

  void OnReadDone(bool ok) override {
    bool release = false;
    {
      absl::MutexLock lock(&mu_);
      if (ok) {
        answers_.push_back(std::move(incoming_));
        incoming_.Clear();
      } else {
        ended_ = true;
        release = ReleaseLocked();
      }
    }
    if (ok) StartRead(&incoming_);
    if (release) RemoveHold();
  }

  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    done_ = true;
  }

 private:
  bool Answered() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !answers_.empty() || done_ || broken_;
  }

  // Whether to drop the hold now: the stream ended and no write is left to
  // start (once).
  bool ReleaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!ended_ || writing_ || released_) return false;
    released_ = true;
    return true;
  }

  grpc::ClientContext context_;
  v1::StepStreamResponse incoming_;
  mutable absl::Mutex mu_;
  std::deque<v1::StepRequest> writes_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::StepStreamResponse> answers_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

// A step sent on every rank's stream.
class GrpcWorkerGroup::StreamedStep final : public PendingStep {
 public:
  StreamedStep(const GrpcWorkerGroup* group,
               std::vector<std::shared_ptr<RankStream>> streams,
               uint64_t step_id, absl::Time deadline)
      : group_(group),
        streams_(std::move(streams)),
        step_id_(step_id),
        deadline_(deadline) {}
  ~StreamedStep() override {
    // Never waited for: its answers would be taken for the next steps'.
    if (!waited_) {
      for (const std::shared_ptr<RankStream>& s : streams_) s->Break();
    }
  }
  StreamedStep(const StreamedStep&) = delete;
  StreamedStep& operator=(const StreamedStep&) = delete;

  absl::StatusOr<v1::StepResponse> Wait() override {
    waited_ = true;
    const size_t n = streams_.size();
    std::vector<grpc::Status> statuses(n);
    std::vector<v1::StepResponse> responses(n);
    for (size_t r = 0; r < n; ++r) {
      absl::StatusOr<v1::StepStreamResponse> answer =
          streams_[r]->Next(deadline_);
      if (!answer.ok()) {
        statuses[r] = ToGrpcStatus(answer.status());
      } else if (answer->step_id() != step_id_) {
        // Answers are matched by order; a mismatch means the stream is out
        // of step with this group.
        streams_[r]->Break();
        statuses[r] =
            grpc::Status(grpc::StatusCode::UNAVAILABLE,
                         absl::StrCat("the answer to step ", answer->step_id(),
                                      " came for step ", step_id_));
      } else if (answer->code() != 0) {
        statuses[r] =
            grpc::Status(static_cast<grpc::StatusCode>(answer->code()),
                         answer->message(), answer->details());
      } else {
        responses[r] = std::move(*answer->mutable_response());
      }
    }
    return group_->Combine(std::move(statuses), std::move(responses));
  }

 private:
  const GrpcWorkerGroup* const group_;
  const std::vector<std::shared_ptr<RankStream>> streams_;
  const uint64_t step_id_;
  const absl::Time deadline_;
  bool waited_ = false;
};

GrpcWorkerGroup::GrpcWorkerGroup(const GrpcWorkerGroupOptions& options)
    : options_(options) {}

GrpcWorkerGroup::~GrpcWorkerGroup() = default;

const v1::StepRequest& GrpcWorkerGroup::Stamp(
    const v1::StepRequest& request,
    std::optional<v1::StepRequest>& stamped) const {
  // Every step carries this coordinator's id (sequence ownership,
  // worker.proto); a copy only when the caller did not set it.
  if (request.coordinator_id() == options_.coordinator_id) return request;
  stamped.emplace(request);
  stamped->set_coordinator_id(options_.coordinator_id);
  return *stamped;
}

std::unique_ptr<WorkerGroup::PendingStep> GrpcWorkerGroup::StartStep(
    const v1::StepRequest& request) {
  if (!options_.step_stream) {
    return std::make_unique<DoneStep>(Step(request));
  }
  std::optional<v1::StepRequest> stamped;
  const v1::StepRequest& sent = Stamp(request, stamped);
  const absl::Time deadline = absl::Now() + options_.step_timeout;
  std::vector<std::shared_ptr<RankStream>> streams;
  // Broken streams replaced here; closed (which waits for their end) after
  // the lock is released.
  std::vector<std::shared_ptr<RankStream>> replaced;
  {
    // Steps are queued on every rank in the same order.
    absl::MutexLock lock(&streams_mu_);
    if (streams_.empty()) streams_.resize(stubs_.size());
    for (size_t r = 0; r < stubs_.size(); ++r) {
      if (streams_[r] == nullptr || streams_[r]->broken()) {
        replaced.push_back(std::move(streams_[r]));
        streams_[r] = std::make_shared<RankStream>(stubs_[r].get());
      }
    }
    streams = streams_;
    for (const std::shared_ptr<RankStream>& stream : streams) {
      stream->Send(sent);
    }
  }
  replaced.clear();
  return std::make_unique<StreamedStep>(this, std::move(streams),
                                        sent.step_id(), deadline);
}

absl::StatusOr<v1::StepResponse> GrpcWorkerGroup::Step(
    const v1::StepRequest& request) {
  if (options_.step_stream) return StartStep(request)->Wait();
  std::optional<v1::StepRequest> stamped;
  const v1::StepRequest& sent = Stamp(request, stamped);
  const int n = size();
  std::vector<v1::StepResponse> responses(n);
  std::vector<grpc::Status> statuses =
      CallEveryRank(n, options_.step_timeout,
                    [&](int r, grpc::ClientContext* context,
                        std::function<void(grpc::Status)> done) {
                      stubs_[r]->async()->Step(context, &sent, &responses[r],
                                               std::move(done));
                    });
  return Combine(std::move(statuses), std::move(responses));
}

absl::StatusOr<v1::StepResponse> GrpcWorkerGroup::Combine(
    std::vector<grpc::Status> statuses,
    std::vector<v1::StepResponse> responses) const {
  const int n = size();
  // Report the most telling error: a refused plan (refused alike on every
  // rank) before a lost rank.
  int first_bad = -1, refused = -1;
  bool all_not_run = true;
  for (int r = 0; r < n; ++r) {
    if (statuses[r].ok()) continue;
    if (first_bad < 0) first_bad = r;
    if (statuses[r].error_details() != kStepNotRunDetails) {
      all_not_run = false;
    }
    const grpc::StatusCode code = statuses[r].error_code();
    if (refused < 0 && (code == grpc::StatusCode::INVALID_ARGUMENT ||
                        code == grpc::StatusCode::RESOURCE_EXHAUSTED)) {
      refused = r;
    }
  }
  if (refused >= 0) first_bad = refused;
  if (first_bad >= 0 && refused < 0 && all_not_run) {
    return StepNotRunError(
        absl::StrCat("worker ", first_bad, " (", options_.workers[first_bad],
                     "): ", statuses[first_bad].error_message()));
  }
  if (first_bad >= 0) {
    const absl::Status st = FromGrpcStatus(statuses[first_bad]);
    const absl::StatusCode code =
        st.code() == absl::StatusCode::kDeadlineExceeded
            ? absl::StatusCode::kUnavailable
            : st.code();
    return absl::Status(
        code, absl::StrCat("worker ", first_bad, " (",
                           options_.workers[first_bad], "): ", st.message()));
  }
  // Rank 0's results are the step's; every rank must have sampled the same
  // tokens, as each starts its next chunks with its own. Ranks that did not
  // are out of step with each other: the group is as good as lost.
  const v1::StepResponse& first = responses[0];
  for (int r = 1; r < n; ++r) {
    const v1::StepResponse& other = responses[r];
    auto out_of_step = [&](const std::string& what) {
      return absl::DataLossError(
          absl::StrCat("worker ", r, " (", options_.workers[r],
                       ") sampled other tokens than worker 0 (", what,
                       "); the ranks are out of step"));
    };
    if (other.results_size() != first.results_size()) {
      return out_of_step(absl::StrCat(other.results_size(),
                                      " results where worker 0 has ",
                                      first.results_size()));
    }
    for (int i = 0; i < first.results_size(); ++i) {
      const v1::ChunkResult& a = first.results(i);
      const v1::ChunkResult& b = other.results(i);
      if (a.sequence_id() != b.sequence_id() || a.token_id() != b.token_id()) {
        return out_of_step(absl::StrCat("sequence ", a.sequence_id(),
                                        ": token ", b.token_id(), " vs ",
                                        a.token_id()));
      }
      // Speculative decoding: the same drafts accepted, or the ranks'
      // sequences now differ in length.
      if (a.num_draft_tokens() != b.num_draft_tokens() ||
          !std::equal(a.new_token_ids().begin(), a.new_token_ids().end(),
                      b.new_token_ids().begin(), b.new_token_ids().end())) {
        return out_of_step(absl::StrCat(
            "sequence ", a.sequence_id(), ": accepted ", b.new_token_ids_size(),
            " tokens of ", b.num_draft_tokens(), " drafts vs ",
            a.new_token_ids_size(), " of ", a.num_draft_tokens()));
      }
    }
  }
  return std::move(responses[0]);
}

absl::StatusOr<std::vector<v1::GetInfoResponse>> GrpcWorkerGroup::Info() {
  const int n = size();
  std::vector<v1::GetInfoResponse> responses(n);
  const v1::GetInfoRequest request;
  const std::vector<grpc::Status> statuses =
      CallEveryRank(n, options_.control_timeout,
                    [&](int r, grpc::ClientContext* context,
                        std::function<void(grpc::Status)> done) {
                      stubs_[r]->async()->GetInfo(
                          context, &request, &responses[r], std::move(done));
                    });
  for (int r = 0; r < n; ++r) {
    if (!statuses[r].ok()) {
      return absl::UnavailableError(
          absl::StrCat("worker ", r, " (", options_.workers[r],
                       ") is not ready: ", statuses[r].error_message()));
    }
    if (responses[r].rank() != r || responses[r].tp_size() != n) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", r, " (", options_.workers[r], ") is rank ",
          responses[r].rank(), " of ", responses[r].tp_size(),
          ", but the coordinator lists it as rank ", r, " of ", n));
    }
  }
  return responses;
}

absl::Status GrpcWorkerGroup::JoinGroup(int64_t generation) {
  const int n = size();
  std::vector<v1::JoinGroupResponse> responses(n);
  v1::JoinGroupRequest request;
  request.set_generation(generation);
  request.set_coordinator_id(options_.coordinator_id);
  const std::vector<grpc::Status> statuses =
      CallEveryRank(n, options_.join_timeout,
                    [&](int r, grpc::ClientContext* context,
                        std::function<void(grpc::Status)> done) {
                      stubs_[r]->async()->JoinGroup(
                          context, &request, &responses[r], std::move(done));
                    });
  for (int r = 0; r < n; ++r) {
    if (statuses[r].ok()) continue;
    const absl::Status st = FromGrpcStatus(statuses[r]);
    return absl::Status(
        st.code(), absl::StrCat("worker ", r, " (", options_.workers[r],
                                ") did not join group generation ", generation,
                                ": ", st.message()));
  }
  return absl::OkStatus();
}

}  // namespace mneme::coordinator
