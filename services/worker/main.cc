// mneme_worker: one tensor-parallel rank of the model. Flags -> options ->
// serve the Worker API (and, on rank 0, the group's rendezvous store) ->
// join the group and load the shard (NOT_SERVING until then) -> serve step
// plans until SIGTERM -> drain.

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/grpc_channel.h"
#include "common/inflight_gate.h"
#include "common/metrics.h"
#include "common/metrics_http_server.h"
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
  // A broken group cannot heal in place: exit non-zero so the supervisor
  // (systemd, Kubernetes, `mneme cluster up`) restarts the worker.
  service_options.on_broken = [](const absl::Status& st) {
    std::fprintf(stderr,
                 "mneme_worker: error: the tensor-parallel group "
                 "broke: %s\n",
                 std::string(st.message()).c_str());
    std::fflush(stderr);
    std::_Exit(1);  // Not exit(): other threads are still running.
  };
  service_options.metrics = &metrics;
  absl::StatusOr<std::unique_ptr<mneme::worker::WorkerService>> service =
      mneme::worker::WorkerService::Create(service_options, &gate);
  if (!service.ok()) mneme::ExitWithError(service.status());
  std::vector<grpc::Service*> services = {service->get()};
  std::unique_ptr<mneme::gpu::RendezvousService> rendezvous;
  if (runtime_options->model.tp_rank == 0 &&
      runtime_options->model.tp_size > 1) {
    absl::StatusOr<std::unique_ptr<mneme::gpu::RendezvousService>> r =
        mneme::gpu::RendezvousService::Create({}, &gate);
    if (!r.ok()) mneme::ExitWithError(r.status());
    rendezvous = *std::move(r);
    services.push_back(rendezvous.get());
  }
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
                     (*runtime)->comm());
  (*runner)->SetServing(true);

  mneme::SystemdNotifier notifier;
  const int code = mneme::ServeUntilSignal(**runner, notifier);
  http->reset();
  runner->reset();
  return code;
}
