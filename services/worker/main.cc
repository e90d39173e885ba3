// mneme_worker: one tensor-parallel rank of the model. Flags -> options ->
// serve the Worker API (and, on rank 0, the group's rendezvous store) ->
// load the shard (NOT_SERVING until then) -> join the group when the
// coordinator forms it (again after a peer restarted or a collective failed,
// keeping the weights) -> serve step plans until SIGTERM -> drain.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/grpc_channel.h"
#include "common/inflight_gate.h"
#include "common/metrics.h"
#include "common/metrics_http_server.h"
#include "glog/logging.h"
#include "gpu/comm/rendezvous_service.h"
#include "services/common/daemon.h"
#include "services/common/server_flags.h"
#include "services/common/server_runner.h"
#include "services/common/systemd_notifier.h"
#include "services/worker/worker_flags.h"
#include "services/worker/worker_runtime.h"
#include "services/worker/worker_service.h"

int main(int argc, char** argv) {
  mneme::InitDaemon(argc, argv,
                    "mneme_worker --checkpoint=DIR [--rank=R --tp_size=N "
                    "--group=HOST:PORT] [--engram_store=HOST:PORT] "
                    "[--listen=HOST:PORT]");
  absl::StatusOr<mneme::ServerOptions> server_options =
      mneme::ServerOptionsFromFlags(mneme::kWorkerPort,
                                    mneme::kWorkerMetricsPort);
  if (!server_options.ok()) mneme::ExitWithError(server_options.status());
  absl::StatusOr<mneme::worker::WorkerRuntimeOptions> runtime_options =
      mneme::WorkerRuntimeOptionsFromFlags();
  if (!runtime_options.ok()) mneme::ExitWithError(runtime_options.status());
  absl::StatusOr<mneme::ClientChannelOptions> peer_options =
      mneme::PeerChannelOptionsFromFlags();
  if (!peer_options.ok()) mneme::ExitWithError(peer_options.status());

  mneme::ExitIfCheckConfig("mneme_worker");
  // The channels to rank 0's rendezvous service and to the Engram store
  // are built inside the runtime: they take these defaults.
  mneme::SetPeerChannelDefaults(*peer_options);

  mneme::InflightGate gate;
  mneme::MetricsRegistry metrics;
  mneme::worker::WorkerServiceOptions service_options =
      mneme::WorkerServiceOptionsFromFlags();
  // A broken group heals in place: the worker keeps its weights and waits
  // for the coordinator to re-form the group (JoinGroup).
  service_options.on_broken = [](const absl::Status& st) {
    LOG(ERROR) << "the tensor-parallel group broke: " << st
               << "; waiting for the coordinator to re-form it";
  };
  service_options.metrics = &metrics;
  std::unique_ptr<mneme::gpu::RendezvousService> rendezvous;
  if (runtime_options->model.tp_rank == 0 &&
      runtime_options->model.tp_size > 1) {
    absl::StatusOr<std::unique_ptr<mneme::gpu::RendezvousService>> r =
        mneme::gpu::RendezvousService::Create({}, &gate);
    if (!r.ok()) mneme::ExitWithError(r.status());
    rendezvous = *std::move(r);
    // Once every rank is in generation N, the keys of older generations are
    // never read again: keep the store's byte budget for re-formings.
    service_options.on_joined = [store = &rendezvous->store(),
                                 group = runtime_options->group_name](
                                    int64_t generation) {
      const int64_t erased = store->EraseIf([&](absl::string_view key) {
        return mneme::worker::IsSupersededGenerationKey(group, generation, key);
      });
      VLOG(1) << "erased " << erased << " rendezvous keys of generations < "
              << generation;
    };
  }
  absl::StatusOr<std::unique_ptr<mneme::worker::WorkerService>> service =
      mneme::worker::WorkerService::Create(service_options, &gate);
  if (!service.ok()) mneme::ExitWithError(service.status());
  std::vector<grpc::Service*> services = {service->get()};
  if (rendezvous != nullptr) services.push_back(rendezvous.get());
  absl::StatusOr<std::unique_ptr<mneme::ServerRunner>> runner =
      mneme::ServerRunner::Create(*server_options, services, &gate);
  if (!runner.ok()) mneme::ExitWithError(runner.status());
  (*runner)->SetServing(false);
  absl::StatusOr<std::unique_ptr<mneme::MetricsHttpServer>> http =
      mneme::StartMetricsServer(*server_options, metrics, **runner);
  if (!http.ok()) mneme::ExitWithError(http.status());
  mneme::PrintListening(**runner);
  if (runtime_options->group_address.empty()) {
    runtime_options->group_address = (*runner)->address().ToString();
  }

  absl::StatusOr<std::unique_ptr<mneme::worker::WorkerRuntime>> runtime =
      mneme::worker::WorkerRuntime::Create(*runtime_options);
  if (!runtime.ok()) mneme::ExitWithError(runtime.status());
  (*service)->Attach(&(*runtime)->model(), &(*runtime)->backend(),
                     (*runtime)->membership(), (*runtime)->drafter());
  (*runner)->SetServing(true);

  mneme::SystemdNotifier notifier;
  const int code = mneme::ServeUntilSignal(**runner, notifier);
  http->reset();
  runner->reset();
  return code;
}
