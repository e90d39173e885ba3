// mneme_engram_store: serves a node's share of the Engram tables over gRPC
// (mneme.engram.v1.EngramStore). Flags -> options -> open the store (ready
// only once the tables open and verify) -> serve until SIGTERM -> drain.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "common/inflight_gate.h"
#include "common/metrics.h"
#include "common/metrics_http_server.h"
#include "engram_store/engram_store.h"
#include "engram_store/service/engram_service.h"
#include "engram_store/service/request_handler.h"
#include "engram_store/service/shm_server.h"
#include "glog/logging.h"
#include "services/common/daemon.h"
#include "services/common/server_flags.h"
#include "services/common/server_runner.h"
#include "services/common/systemd_notifier.h"
#include "services/engram/engram_flags.h"

int main(int argc, char** argv) {
  mneme::InitDaemon(argc, argv,
                    "mneme_engram_store --checkpoint=DIR [--listen=HOST:PORT] "
                    "[--tp_size=N --ranks=R,...] [--shm_socket=PATH] "
                    "[--tls_cert ...]");
  absl::StatusOr<mneme::ServerOptions> server_options =
      mneme::ServerOptionsFromFlags(mneme::kEngramStorePort,
                                    mneme::kEngramStoreMetricsPort);
  if (!server_options.ok()) mneme::ExitWithError(server_options.status());
  absl::StatusOr<mneme::engram::EngramStoreOptions> store_options =
      mneme::EngramStoreOptionsFromFlags();
  if (!store_options.ok()) mneme::ExitWithError(store_options.status());

  mneme::ExitIfCheckConfig("mneme_engram_store");

  mneme::MetricsRegistry metrics;
  absl::StatusOr<std::unique_ptr<mneme::engram::EngramStore>> store =
      mneme::engram::EngramStore::Create(*store_options, &metrics);
  if (!store.ok()) mneme::ExitWithError(store.status());

  mneme::InflightGate gate;
  mneme::engram::EngramServiceOptions service_options =
      mneme::EngramServiceOptionsFromFlags();
  // A Lookup response stays below the server's message limit (with room
  // for the message's other fields), whatever --max_message_bytes says.
  service_options.limits.max_response_bytes = std::max<int64_t>(
      1, std::min<int64_t>(
             service_options.limits.max_response_bytes,
             int64_t{server_options->max_message_bytes} - (int64_t{64} << 10)));
  absl::StatusOr<std::unique_ptr<mneme::engram::EngramService>> service =
      mneme::engram::EngramService::Create(service_options, store->get(), &gate,
                                           &metrics);
  if (!service.ok()) mneme::ExitWithError(service.status());

  absl::StatusOr<std::unique_ptr<mneme::ServerRunner>> runner =
      mneme::ServerRunner::Create(*server_options, {service->get()}, &gate);
  if (!runner.ok()) mneme::ExitWithError(runner.status());
  absl::StatusOr<std::unique_ptr<mneme::MetricsHttpServer>> http =
      mneme::StartMetricsServer(*server_options, metrics, **runner);
  if (!http.ok()) mneme::ExitWithError(http.status());
  // Workers on this node: the same API through shared memory.
  const mneme::engram::RequestHandler shm_handler(store->get(),
                                                  service_options.limits);
  std::unique_ptr<mneme::engram::ShmEngramServer> shm;
  if (const mneme::engram::ShmServerOptions shm_options =
          mneme::ShmServerOptionsFromFlags();
      !shm_options.socket_path.empty()) {
    absl::StatusOr<std::unique_ptr<mneme::engram::ShmEngramServer>> server =
        mneme::engram::ShmEngramServer::Create(shm_options, &shm_handler, &gate,
                                               &metrics);
    if (!server.ok()) mneme::ExitWithError(server.status());
    shm = *std::move(server);
    LOG(INFO) << "shared-memory transport on " << shm->socket_path();
  }
  mneme::PrintListening(**runner);

  mneme::SystemdNotifier notifier;
  const int code = mneme::ServeUntilSignal(**runner, notifier);
  if (shm != nullptr) shm->Shutdown();
  http->reset();
  runner->reset();
  return code;
}
