#include "services/coordinator/readiness.h"

namespace mneme::coordinator {

ReadinessMirror::ReadinessMirror(const Engine* engine, ServerRunner* runner,
                                 absl::Duration interval) {
  thread_ = std::thread([this, engine, runner, interval] {
    bool last = false;
    runner->SetServing(false);
    do {
      const bool ready = engine->ready();
      if (ready != last) runner->SetServing(ready);
      last = ready;
    } while (!stop_.WaitForNotificationWithTimeout(interval));
  });
}

void ReadinessMirror::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

}  // namespace mneme::coordinator
