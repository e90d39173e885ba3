#ifndef MNEME_SERVICES_COORDINATOR_READINESS_H_
#define MNEME_SERVICES_COORDINATOR_READINESS_H_

#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "services/common/server_runner.h"
#include "services/coordinator/engine.h"

namespace mneme::coordinator {

// Mirrors the engine's readiness into the server's health status (SERVING
// only while every worker is ready), polling every `interval` on its own
// thread until Stop(). Both are borrowed.
class ReadinessMirror {
 public:
  ReadinessMirror(const Engine* engine, ServerRunner* runner,
                  absl::Duration interval = absl::Milliseconds(100));
  ~ReadinessMirror() { Stop(); }
  // Idempotent; leaves the health status as it is.
  void Stop();

 private:
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace mneme::coordinator

#endif  // MNEME_SERVICES_COORDINATOR_READINESS_H_
