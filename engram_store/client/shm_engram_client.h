#ifndef MNEME_ENGRAM_STORE_CLIENT_SHM_ENGRAM_CLIENT_H_
#define MNEME_ENGRAM_STORE_CLIENT_SHM_ENGRAM_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engram_store/client/engram_client.h"

namespace mneme::engram {

struct ShmEngramClientOptions {
  // The store's shared-memory socket (its --shm_socket). Required.
  std::string socket_path;
  // Deadline of each attempt of a call. Default: 10 s.
  absl::Duration timeout = absl::Seconds(10);
  // Attempts per call; only Unavailable (the store restarting, the
  // connection lost) is retried, on a new connection. Default: 4.
  int max_attempts = 4;
  // Backoff before the second attempt, doubling up to max_backoff, each
  // with up to 50% random jitter. Default: 50 ms, 2 s.
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
  // Where calls go while the socket cannot be reached at all (no store on
  // this node listens there): typically the gRPC client of the same store.
  // Borrowed; may be null (then such calls fail Unavailable).
  EngramClient* fallback = nullptr;
  // How long a call spins on the store's answer before it blocks on the
  // socket: a lookup of a few tokens is answered within it, without waking
  // the thread. Zero: never spin; at most 10 ms. Default: 50 us.
  absl::Duration spin = absl::Microseconds(50);
  // How long after a failed connection attempt calls go to the fallback
  // before the socket is tried again. Default: 1 s.
  absl::Duration reconnect_interval = absl::Seconds(1);
};

// EngramClient over the same-node shared-memory transport
// (engram_store/shm/shm_wire.h): requests and rows cross a memory area shared
// with the store; only small control messages cross the socket. The same
// answers as the gRPC client (the store runs the same handler), and the same
// behaviour on faults: every call has a deadline, Unavailable is retried
// with backoff on a fresh connection, a malformed answer is DataLoss and
// drops the connection. Calls are serialized on the one connection (a worker
// makes one lookup at a time). Thread-safe.
class ShmEngramClient final : public EngramClient {
 public:
  // InvalidArgument for bad options. Does not connect yet.
  static absl::StatusOr<std::unique_ptr<ShmEngramClient>> Create(
      const ShmEngramClientOptions& options);
  ~ShmEngramClient() override;

  absl::StatusOr<v1::LookupResponse> Lookup(
      const v1::LookupRequest& request) override;
  absl::StatusOr<v1::LookupResponse> LookupStream(
      const v1::LookupRequest& request) override;
  absl::StatusOr<int32_t> LookupInto(const v1::LookupRequest& request,
                                     bool stream,
                                     absl::Span<uint8_t> rows) override;
  absl::StatusOr<v1::PrefetchResponse> Prefetch(
      const v1::PrefetchRequest& request) override;
  absl::StatusOr<v1::DescribeResponse> Describe() override;

  // Whether the last call went through shared memory (false: fallback).
  bool last_call_used_shared_memory() const;

  // One piece of a lookup answer, in the shared area (internal).
  struct Piece;

 private:
  // Receives the pieces of a lookup answer.
  using PieceSink = std::function<absl::Status(const Piece&)>;

  explicit ShmEngramClient(const ShmEngramClientOptions& options)
      : options_(options) {}

  // Lookup (stream false) or LookupStream, as a response.
  absl::StatusOr<v1::LookupResponse> LookupAsResponse(
      const v1::LookupRequest& request, bool stream);

  // One attempt over the connection (made first if needed). For lookups,
  // `sink` gets each piece; for the others, *payload gets the response
  // proto's bytes.
  absl::Status CallOnce(uint32_t op, const google::protobuf::Message& request,
                        const PieceSink& sink, std::string* payload)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Connect(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Disconnect() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `attempt` over shared memory with the retry policy, or `fallback`
  // on options.fallback when the socket cannot be reached (and for
  // reconnect_interval after that).
  absl::Status Dispatch(
      const std::function<absl::Status()>& attempt,
      const std::function<absl::Status(EngramClient&)>& fallback)
      ABSL_LOCKS_EXCLUDED(mu_);

  const ShmEngramClientOptions options_;
  mutable absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  uint8_t* area_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t request_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t response_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Answers taken from the store's mailbox on this connection.
  uint64_t replies_seen_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  // Until when calls go to the fallback (after a failed connection).
  absl::Time fallback_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // The last Connect failed because nothing listens at the socket path, or
  // the store there speaks another version of the protocol.
  bool unreachable_ ABSL_GUARDED_BY(mu_) = false;
  bool last_shared_ ABSL_GUARDED_BY(mu_) = false;
  // LookupInto's request as sent: the caller's, asking for raw rows.
  v1::LookupRequest raw_request_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mneme::engram

#endif  // MNEME_ENGRAM_STORE_CLIENT_SHM_ENGRAM_CLIENT_H_
