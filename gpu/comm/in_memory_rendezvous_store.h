#ifndef MNEME_GPU_COMM_IN_MEMORY_RENDEZVOUS_STORE_H_
#define MNEME_GPU_COMM_IN_MEMORY_RENDEZVOUS_STORE_H_

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpu/comm/rendezvous_store.h"

namespace mneme::gpu {

struct InMemoryRendezvousStoreOptions {
  // Longest key, in bytes. Default: 1 KiB.
  int64_t max_key_bytes = 1 << 10;
  // Largest value, in bytes. Default: 1 MiB.
  int64_t max_value_bytes = 1 << 20;
  // Budget of all keys plus values held, in bytes; a Set past it is refused
  // with ResourceExhausted. Default: 64 MiB.
  int64_t max_total_bytes = int64_t{64} << 20;
  // Most keys one Get may ask for. Default: 4096.
  int64_t max_keys_per_get = 4096;
  // Most gets waiting at once (blocking and asynchronous); more are refused
  // with ResourceExhausted. Default: 4096.
  int64_t max_waiting_gets = 4096;
};

// A bounded RendezvousStore in process memory: for ranks that are threads
// of one process, and the store behind the Rendezvous gRPC service (which
// uses the asynchronous StartGet so that its reactors never block).
//
// Create() starts one timer thread that ends waiting gets at their
// deadlines; the destructor stops it and fails gets still waiting with
// Unavailable. Thread-safe.
class InMemoryRendezvousStore final : public RendezvousStore {
 public:
  // Receives the values of a get (in the order of its keys) or its error.
  using GetCallback =
      absl::AnyInvocable<void(absl::StatusOr<std::vector<std::string>>)>;

  // InvalidArgument naming the field for a limit < 1.
  static absl::StatusOr<std::unique_ptr<InMemoryRendezvousStore>> Create(
      const InMemoryRendezvousStoreOptions& options);

  InMemoryRendezvousStore(const InMemoryRendezvousStore&) = delete;
  InMemoryRendezvousStore& operator=(const InMemoryRendezvousStore&) = delete;
  ~InMemoryRendezvousStore() override;

  // RendezvousStore. Get blocks the calling thread.
  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::vector<std::string>> Get(
      const std::vector<std::string>& keys, absl::Duration timeout) override;

  // Get without blocking: `done` is called exactly once, with the values or
  // the errors of Get (DeadlineExceeded at `deadline`). It runs on this
  // thread before StartGet returns when the get is answered at once (all
  // keys there, invalid, refused, or `deadline` already past); otherwise
  // later on the thread of the Set that supplies the last missing key, of
  // the store's timer, of CancelGet, or of the destructor. It runs without
  // the store's lock held, so it may call the store. Returns an id for
  // CancelGet.
  int64_t StartGet(std::vector<std::string> keys, absl::Time deadline,
                   GetCallback done);

  // Ends the waiting get `id` with `status` (not OK), running its callback
  // on this thread before returning. Does nothing when that get already
  // ended.
  void CancelGet(int64_t id, const absl::Status& status);

  // Removes every key for which `erase` is true (e.g. the keys of a group
  // generation that has been superseded, so that re-forming a group does not
  // fill the byte budget); returns how many. Waiting gets are unaffected.
  int64_t EraseIf(absl::FunctionRef<bool(absl::string_view key)> erase);

  // Bytes of keys plus values held.
  int64_t total_bytes() const;
  // Gets waiting now.
  int64_t waiting_gets() const;

 private:
  struct Waiter {
    std::vector<std::string> keys;
    absl::Time deadline;
    GetCallback done;
    // Distinct keys not yet set.
    int64_t missing = 0;
  };
  // A finished get whose callback is still to run (outside the lock).
  using Completion =
      std::pair<GetCallback, absl::StatusOr<std::vector<std::string>>>;

  explicit InMemoryRendezvousStore(const InMemoryRendezvousStoreOptions& o)
      : options_(o) {}

  absl::Status ValidateKey(absl::string_view key) const;
  std::vector<std::string> ValuesOf(const std::vector<std::string>& keys) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes waiter `id` (which must exist) from every index; returns it.
  Waiter RemoveWaiter(int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TimerLoop();

  const InMemoryRendezvousStoreOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  int64_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<int64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  // Missing key -> ids of the gets waiting for it.
  absl::flat_hash_map<std::string, std::vector<int64_t>> waiting_on_
      ABSL_GUARDED_BY(mu_);
  // (deadline, id) of every waiting get, for the timer.
  std::set<std::pair<absl::Time, int64_t>> deadlines_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Set to wake the timer (a new deadline, or stopping).
  bool timer_wake_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread timer_;
};

}  // namespace mneme::gpu

#endif  // MNEME_GPU_COMM_IN_MEMORY_RENDEZVOUS_STORE_H_
