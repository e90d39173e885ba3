// Prints the default gRPC and metrics ports of the worker and the
// coordinator, as their flags headers define them, as one JSON object:
// {"mneme_worker": [grpc, metrics], "mneme_coordinator": [grpc, metrics]}.
// The deploy tests compare the units' and manifests' ports with these.
// (//services/engram:engram_flags is private to its package: the engram
// store's ports are spelled out in deploy_lib.py.)

#include <cstdio>

#include "services/coordinator/coordinator_flags.h"
#include "services/worker/worker_flags.h"

int main() {
  std::printf("{\"mneme_worker\": [%d, %d], \"mneme_coordinator\": [%d, %d]}\n",
              mneme::kWorkerPort, mneme::kWorkerMetricsPort,
              mneme::kCoordinatorPort, mneme::kCoordinatorMetricsPort);
  return 0;
}
