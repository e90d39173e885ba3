#include "services/common/server_runner.h"

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_builder.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/cluster_secret.h"
#include "glog/logging.h"

namespace mneme {

absl::StatusOr<std::unique_ptr<ServerRunner>> ServerRunner::Create(
    const ServerOptions& options, const std::vector<grpc::Service*>& services,
    InflightGate* gate) {
  if (gate == nullptr) {
    return absl::InvalidArgumentError("ServerRunner needs an InflightGate");
  }
  if (options.drain_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--drain_timeout must not be negative");
  }
  if (options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError("--max_message_bytes must be positive");
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  if (!options.cluster_secret_file.empty()) {
    absl::StatusOr<std::vector<std::string>> secrets =
        ReadClusterSecretFile(options.cluster_secret_file);
    if (!secrets.ok()) return secrets.status();
    gate->SetClusterSecrets(*std::move(secrets));
  }
  if (absl::Status bindable = CheckBindable(options.listen, "--listen");
      !bindable.ok()) {
    return bindable;
  }

  auto runner = std::unique_ptr<ServerRunner>(new ServerRunner(options, gate));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(options.listen.ToString(), *credentials,
                           &bound_port);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  for (grpc::Service* service : services) builder.RegisterService(service);
  runner->server_ = builder.BuildAndStart();
  if (runner->server_ == nullptr || bound_port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on --listen=", options.listen.ToString()));
  }
  runner->address_ = HostPort{options.listen.host, bound_port};
  runner->server_->GetHealthCheckService()->SetServingStatus(true);
  return runner;
}

ServerRunner::~ServerRunner() { Drain(); }

void ServerRunner::SetServing(bool serving) {
  absl::MutexLock lock(&mu_);
  if (gate_->draining() || stopped_) return;
  serving_ = serving;
  server_->GetHealthCheckService()->SetServingStatus(serving);
}

bool ServerRunner::serving() const {
  absl::MutexLock lock(&mu_);
  return serving_ && !gate_->draining();
}

void ServerRunner::Drain() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    serving_ = false;
    server_->GetHealthCheckService()->SetServingStatus(false);
  }
  gate_->BeginDrain();
  const absl::Time deadline = absl::Now() + options_.drain_timeout;
  LOG(INFO) << "draining " << gate_->inflight() << " in-flight RPCs (up to "
            << options_.drain_timeout << ")";
  if (!gate_->WaitIdle(deadline)) {
    LOG(WARNING) << "drain deadline passed with " << gate_->inflight()
                 << " RPCs in flight; cancelling them";
  }
  // Whatever is left (streams, health watches) is cancelled at the deadline.
  server_->Shutdown(absl::ToChronoTime(
      std::max(deadline, absl::Now() + absl::Milliseconds(100))));
  server_->Wait();
  // Cancelled handlers release their passes as they unwind.
  gate_->WaitIdle(absl::Now() + absl::Seconds(5));
}

}  // namespace mneme
