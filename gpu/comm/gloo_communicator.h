#ifndef MNEME_GPU_COMM_GLOO_COMMUNICATOR_H_
#define MNEME_GPU_COMM_GLOO_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gpu/comm/communicator.h"
#include "gpu/comm/rendezvous_store.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace mneme::gpu {

struct GlooCommunicatorOptions {
  // This process's rank, in [0, size). Default: 0.
  int rank = 0;
  // Ranks in the group, >= 1. Default: 1.
  int size = 1;
  // Address (name or literal) the TCP transport binds and advertises to its
  // peers; on several nodes, this node's address on the network the peers
  // reach it by. Default: "127.0.0.1" (one node).
  std::string hostname = "127.0.0.1";
  // Network interface to bind instead of `hostname` (e.g. "eth0"); used
  // when non-empty. Default: "".
  std::string interface;
  // Bounds the rendezvous (every rank must arrive within it) and each
  // collective, end to end. Default: 60 s.
  absl::Duration timeout = absl::Seconds(60);
};

// Communicator over Gloo's TCP transport: host memory, for the CPU backend
// and for tests of tensor-parallel code without GPUs. The ranks meet
// through a RendezvousStore (keys under "gloo/"; the store's own prefix
// keeps groups apart), then keep a full mesh of TCP connections.
//
// Gloo reports failures with exceptions; they stop here: a peer that
// closed its connections (died) gives Unavailable, a collective past
// `timeout` DeadlineExceeded (also what a death becomes when it catches a
// send still waiting for that peer's receive: Gloo then notices nothing
// before the timeout, so `timeout` bounds failure detection), and the
// communicator is broken from then on (every later call returns the same
// error; destroy it and form a new group). Invalid arguments (negative count,
// null buffer, bad root) return InvalidArgument without breaking it. A count of
// 0 is a no-op. Input and output buffers of one call must not overlap
// (AllReduceSum and Broadcast work in place on their one buffer).
//
// Thread-safety: one thread at a time, as Communicator says. Owns the Gloo
// context and its connections; `store` is only used during Create().
class GlooCommunicator final : public Communicator {
 public:
  // Binds the transport and runs the rendezvous: blocks until all `size`
  // ranks called Create() with the same store (or `timeout` passed).
  // Process-wide side effect: sets SIGPIPE to ignored if it is at its
  // default (Gloo writes to sockets with writev, so a peer dying mid-write
  // would otherwise kill this process); an installed handler is kept.
  // InvalidArgument naming the field for bad options or when the transport
  // cannot bind `hostname` / `interface`; DeadlineExceeded when the group
  // does not assemble within `timeout`; Unavailable when a peer cannot be
  // connected; the store's errors (e.g. ResourceExhausted) as they are.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(
      const GlooCommunicatorOptions& options, RendezvousStore& store);

  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;
  ~GlooCommunicator() override;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }

  absl::Status AllReduceSum(float* data, int64_t count) override;
  absl::Status AllGather(const float* in, int64_t count, float* out) override;
  absl::Status ReduceScatterSum(const float* in, int64_t count,
                                float* out) override;
  absl::Status Broadcast(float* data, int64_t count, int root) override;
  absl::Status Barrier() override;

  CommStats stats() const override { return stats_; }

 private:
  GlooCommunicator(const GlooCommunicatorOptions& options,
                   std::shared_ptr<gloo::Context> context)
      : options_(options), context_(std::move(context)) {}

  // Runs `op` (which may throw Gloo's exceptions) unless broken; converts
  // and keeps an error; counts the call in stats_.
  template <typename Op>
  absl::Status Run(absl::string_view name, int64_t bytes, Op op);
  // Ring reduce-scatter over Gloo's unbound buffers (Gloo has no
  // new-style reduce-scatter); may throw.
  void RingReduceScatter(const float* in, int64_t count, float* out,
                         uint32_t tag);

  const GlooCommunicatorOptions options_;
  // Shared because Gloo's collective options hold it as shared_ptr.
  std::shared_ptr<gloo::Context> context_;
  absl::Status broken_;
  uint32_t next_tag_ = 0;
  std::vector<float> scratch_;
  CommStats stats_;
};

}  // namespace mneme::gpu

#endif  // MNEME_GPU_COMM_GLOO_COMMUNICATOR_H_
