#ifndef MNEME_COMMON_INFLIGHT_GATE_H_
#define MNEME_COMMON_INFLIGHT_GATE_H_

#include <grpcpp/server_context.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace mneme {

// Admits work while a server runs and refuses it once draining starts, and
// lets the drain wait for admitted work to finish.
//
// Every RPC handler calls Authenticate() first and refuses the call with its
// error (Unauthenticated) when it fails, then Enter() and refuses the call
// (Unavailable) when it returns nullopt; the returned Pass is held until the
// call finishes (move it into the reactor or the task that completes the call).
// Thread-safe.
class InflightGate {
 public:
  // Proof of admission; leaving it releases the slot. Movable, not copyable.
  class Pass {
   public:
    Pass(Pass&& other) noexcept : gate_(other.gate_) { other.gate_ = nullptr; }
    Pass& operator=(Pass&& other) noexcept;
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;
    ~Pass() { Release(); }

   private:
    friend class InflightGate;
    explicit Pass(InflightGate* gate) : gate_(gate) {}
    void Release();
    InflightGate* gate_;
  };

  InflightGate() = default;
  InflightGate(const InflightGate&) = delete;
  InflightGate& operator=(const InflightGate&) = delete;
  // All passes must be gone by now.
  ~InflightGate();

  // The cluster secrets calls must present (see common/cluster_secret.h);
  // empty (the default) = calls are not authenticated. Set before serving.
  void SetClusterSecrets(std::vector<std::string> secrets);

  // OK when no secret is set or the call presents one of them;
  // Unauthenticated otherwise (CheckClusterSecret).
  absl::Status Authenticate(const grpc::ServerContextBase& context) const;

  // A pass, or nullopt once BeginDrain() was called.
  std::optional<Pass> Enter();

  // Refuses new work from now on. Idempotent.
  void BeginDrain();
  bool draining() const;

  // Blocks until no pass is held or `deadline` passes; true when idle.
  bool WaitIdle(absl::Time deadline);

  int64_t inflight() const;

 private:
  mutable absl::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  int64_t inflight_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> secrets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mneme

#endif  // MNEME_COMMON_INFLIGHT_GATE_H_
