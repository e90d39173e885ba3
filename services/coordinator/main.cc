// mneme_coordinator: the cluster's public API. Flags -> options -> serve
// the Serving API (NOT_SERVING until every worker is ready) -> schedule
// steps on the workers and stream tokens until SIGTERM -> drain.

#include <unistd.h>

#include <cstdio>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/inflight_gate.h"
#include "common/metrics.h"
#include "common/metrics_http_server.h"
#include "services/common/daemon.h"
#include "services/common/server_flags.h"
#include "services/common/server_runner.h"
#include "services/common/systemd_notifier.h"
#include "services/coordinator/coordinator_flags.h"
#include "services/coordinator/engine.h"
#include "services/coordinator/grpc_worker_group.h"
#include "services/coordinator/http_front.h"
#include "services/coordinator/readiness.h"
#include "services/coordinator/serving_service.h"
#include "services/coordinator/text_codec.h"

int main(int argc, char** argv) {
  mneme::InitDaemon(argc, argv,
                    "mneme_coordinator --workers=HOST:PORT,... "
                    "[--listen=HOST:PORT] [--max_num_batched_tokens=N]");
  absl::StatusOr<mneme::ServerOptions> server_options =
      mneme::ServerOptionsFromFlags(mneme::kCoordinatorPort,
                                    mneme::kCoordinatorMetricsPort);
  if (!server_options.ok()) mneme::ExitWithError(server_options.status());
  absl::StatusOr<mneme::coordinator::GrpcWorkerGroupOptions> group_options =
      mneme::WorkerGroupOptionsFromFlags();
  if (!group_options.ok()) mneme::ExitWithError(group_options.status());
  if (group_options->coordinator_id.empty()) {
    // Stable across restarts of the same daemon, so that a restarted
    // coordinator owns the sequences it left on the workers.
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
    group_options->coordinator_id =
        absl::StrCat(host, "/", server_options->listen.ToString());
  }
  absl::StatusOr<mneme::coordinator::EngineOptions> engine_options =
      mneme::EngineOptionsFromFlags();
  if (!engine_options.ok()) mneme::ExitWithError(engine_options.status());

  absl::StatusOr<mneme::TextFrontFlags> text_flags =
      mneme::TextFrontFlagsFromFlags();
  if (!text_flags.ok()) mneme::ExitWithError(text_flags.status());
  mneme::ExitIfCheckConfig("mneme_coordinator");
  if (absl::Status st = mneme::LoadApiKey(*text_flags); !st.ok()) {
    mneme::ExitWithError(st);
  }

  absl::StatusOr<std::unique_ptr<mneme::coordinator::GrpcWorkerGroup>> workers =
      mneme::coordinator::GrpcWorkerGroup::Create(*group_options);
  if (!workers.ok()) mneme::ExitWithError(workers.status());
  mneme::MetricsRegistry metrics;
  absl::StatusOr<std::unique_ptr<mneme::coordinator::Engine>> engine =
      mneme::coordinator::Engine::Create(*engine_options, workers->get(),
                                         &metrics);
  if (!engine.ok()) mneme::ExitWithError(engine.status());
  mneme::InflightGate gate;
  mneme::coordinator::TextCodec codec(text_flags->tokenizer_path,
                                      engine->get());
  absl::StatusOr<std::unique_ptr<mneme::coordinator::ServingService>> service =
      mneme::coordinator::ServingService::Create(engine->get(), &gate, &codec,
                                                 text_flags->api_key);
  if (!service.ok()) mneme::ExitWithError(service.status());
  absl::StatusOr<std::unique_ptr<mneme::ServerRunner>> runner =
      mneme::ServerRunner::Create(*server_options, {service->get()}, &gate);
  if (!runner.ok()) mneme::ExitWithError(runner.status());
  (*runner)->SetServing(false);
  absl::StatusOr<std::unique_ptr<mneme::MetricsHttpServer>> http =
      mneme::StartMetricsServer(*server_options, metrics, **runner);
  if (!http.ok()) mneme::ExitWithError(http.status());
  mneme::PrintListening(**runner);

  std::unique_ptr<mneme::coordinator::HttpFront> http_front;
  if (text_flags->http.has_value()) {
    absl::StatusOr<std::unique_ptr<mneme::coordinator::HttpFront>> front =
        mneme::coordinator::HttpFront::Create(*text_flags->http, engine->get(),
                                              &codec, &gate);
    if (!front.ok()) mneme::ExitWithError(front.status());
    http_front = *std::move(front);
    std::printf("http on %s:%d\n", text_flags->http->listen.host.c_str(),
                http_front->port());
    std::fflush(stdout);
  }
  (*engine)->Start();
  // Health follows the workers: SERVING only while every one is ready.
  mneme::coordinator::ReadinessMirror mirror(engine->get(), runner->get());
  mneme::SystemdNotifier notifier;
  const int code = mneme::ServeUntilSignal(
      **runner, notifier, [&engine] { return (*engine)->alive(); });
  mirror.Stop();
  if (http_front != nullptr) http_front->Stop();
  (*engine)->Stop();
  http->reset();
  runner->reset();
  return code;
}
