#include "tests/services/common/echo_service.h"

#include <optional>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace mneme::testing {

EchoService::~EchoService() {
  std::vector<std::thread> workers;
  {
    absl::MutexLock lock(&mu_);
    workers.swap(workers_);
  }
  for (std::thread& t : workers) t.join();
}

grpc::ServerUnaryReactor* EchoService::Echo(
    grpc::CallbackServerContext* context,
    const mneme::testing::v1::EchoRequest* request,
    mneme::testing::v1::EchoResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::optional<InflightGate::Pass> pass = gate_->Enter();
  if (!pass.has_value()) {
    reactor->Finish(
        grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is draining"));
    return reactor;
  }
  if (request->delay_ms() <= 0) {
    response->set_text(request->text());
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  absl::MutexLock lock(&mu_);
  workers_.emplace_back(
      [reactor, request, response, pass = std::move(*pass)]() mutable {
        absl::SleepFor(absl::Milliseconds(request->delay_ms()));
        response->set_text(request->text());
        reactor->Finish(grpc::Status::OK);
      });
  return reactor;
}

}  // namespace mneme::testing
