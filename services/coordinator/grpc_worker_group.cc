#include "services/coordinator/grpc_worker_group.h"

#include <functional>
#include <optional>
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

absl::StatusOr<v1::StepResponse> GrpcWorkerGroup::Step(
    const v1::StepRequest& request) {
  // Every step carries this coordinator's id (sequence ownership,
  // worker.proto); a copy only when the caller did not set it.
  std::optional<v1::StepRequest> stamped;
  if (request.coordinator_id() != options_.coordinator_id) {
    stamped.emplace(request);
    stamped->set_coordinator_id(options_.coordinator_id);
  }
  const v1::StepRequest& sent = stamped.has_value() ? *stamped : request;
  const int n = size();
  std::vector<v1::StepResponse> responses(n);
  const std::vector<grpc::Status> statuses =
      CallEveryRank(n, options_.step_timeout,
                    [&](int r, grpc::ClientContext* context,
                        std::function<void(grpc::Status)> done) {
                      stubs_[r]->async()->Step(context, &sent, &responses[r],
                                               std::move(done));
                    });
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
