// A daemon wired exactly like Mneme's services (flags -> options -> create ->
// serve until SIGTERM -> drain) around the test Echo service, so tests can
// exercise the shared plumbing as a real process.
#include "absl/status/statusor.h"
#include "common/inflight_gate.h"
#include "common/metrics.h"
#include "common/metrics_http_server.h"
#include "services/common/daemon.h"
#include "services/common/server_flags.h"
#include "services/common/server_runner.h"
#include "services/common/systemd_notifier.h"
#include "tests/services/common/echo_service.h"

int main(int argc, char** argv) {
  mneme::InitDaemon(argc, argv, "plumbing_daemon --listen=HOST:PORT");
  absl::StatusOr<mneme::ServerOptions> options =
      mneme::ServerOptionsFromFlags(/*default_port=*/0);
  if (!options.ok()) mneme::ExitWithError(options.status());

  mneme::InflightGate gate;
  mneme::testing::EchoService echo(&gate);
  absl::StatusOr<std::unique_ptr<mneme::ServerRunner>> runner =
      mneme::ServerRunner::Create(*options, {&echo}, &gate);
  if (!runner.ok()) mneme::ExitWithError(runner.status());
  mneme::MetricsRegistry metrics;
  absl::StatusOr<std::unique_ptr<mneme::MetricsHttpServer>> http =
      mneme::StartMetricsServer(*options, metrics, **runner);
  if (!http.ok()) mneme::ExitWithError(http.status());
  mneme::PrintListening(**runner);

  mneme::SystemdNotifier notifier;
  return mneme::ServeUntilSignal(**runner, notifier);
}
