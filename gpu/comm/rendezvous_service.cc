#include "gpu/comm/rendezvous_service.h"

#include <grpcpp/support/time.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"

namespace mneme::gpu {
namespace {

const grpc::Status kDraining(grpc::StatusCode::UNAVAILABLE,
                             "server is draining");

}  // namespace

// A Get parked in the store: finishes from the store's callback (values,
// deadline, cancellation). Deletes itself in OnDone, which gRPC runs only
// after the handler returned and Finish completed, so the callback (whose
// last act is Finish) never outlives it.
class RendezvousService::GetReactor final : public grpc::ServerUnaryReactor {
 public:
  GetReactor(InMemoryRendezvousStore* store, comm::v1::GetResponse* response,
             InflightGate::Pass pass)
      : store_(store), response_(response), pass_(std::move(pass)) {}

  // Called from the handler, before gRPC can call OnCancel.
  void Start(std::vector<std::string> keys, absl::Time deadline) {
    id_ = store_->StartGet(
        std::move(keys), deadline,
        [this](absl::StatusOr<std::vector<std::string>> values) {
          if (values.ok()) {
            for (std::string& v : *values) response_->add_values(std::move(v));
          }
          Finish(ToGrpcStatus(values.status()));
        });
  }

  void OnCancel() override {
    store_->CancelGet(id_, absl::CancelledError("the Get was cancelled"));
  }

  void OnDone() override { delete this; }

 private:
  InMemoryRendezvousStore* const store_;
  comm::v1::GetResponse* const response_;
  InflightGate::Pass pass_;
  int64_t id_ = 0;
};

absl::StatusOr<std::unique_ptr<RendezvousService>> RendezvousService::Create(
    const RendezvousServiceOptions& options, InflightGate* gate) {
  if (options.max_wait <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("max_wait must be positive");
  }
  if (gate == nullptr) return absl::InvalidArgumentError("gate is required");
  absl::StatusOr<std::unique_ptr<InMemoryRendezvousStore>> store =
      InMemoryRendezvousStore::Create(options.store);
  if (!store.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("store.", store.status().message()));
  }
  std::unique_ptr<RendezvousService> service(
      new RendezvousService(options, gate));
  service->store_ = *std::move(store);
  return service;
}

RendezvousService::~RendezvousService() = default;

grpc::ServerUnaryReactor* RendezvousService::Set(
    grpc::CallbackServerContext* context, const comm::v1::SetRequest* request,
    comm::v1::SetResponse* response) {
  (void)response;  // Has no fields.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status st = gate_->Authenticate(*context); !st.ok()) {
    reactor->Finish(ToGrpcStatus(st));
    return reactor;
  }
  std::optional<InflightGate::Pass> pass = gate_->Enter();
  if (!pass.has_value()) {
    reactor->Finish(kDraining);
    return reactor;
  }
  reactor->Finish(ToGrpcStatus(store_->Set(request->key(), request->value())));
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Get(
    grpc::CallbackServerContext* context, const comm::v1::GetRequest* request,
    comm::v1::GetResponse* response) {
  if (absl::Status st = gate_->Authenticate(*context); !st.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(st));
    return reactor;
  }
  std::optional<InflightGate::Pass> pass = gate_->Enter();
  if (!pass.has_value()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(kDraining);
    return reactor;
  }
  const absl::Duration wait =
      std::min(absl::Milliseconds(std::max<int64_t>(0, request->timeout_ms())),
               options_.max_wait);
  absl::Time deadline = absl::Now() + wait;
  const auto call_deadline = context->deadline();
  if (call_deadline != std::chrono::system_clock::time_point::max()) {
    deadline = std::min(deadline, absl::FromChrono(call_deadline));
  }
  auto* reactor = new GetReactor(store_.get(), response, std::move(*pass));
  reactor->Start(
      std::vector<std::string>(request->keys().begin(), request->keys().end()),
      deadline);
  return reactor;
}

}  // namespace mneme::gpu
