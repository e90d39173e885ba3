#ifndef MNEME_TESTS_SERVICES_COORDINATOR_FAKE_WORKER_GROUP_H_
#define MNEME_TESTS_SERVICES_COORDINATOR_FAKE_WORKER_GROUP_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/worker/v1/worker.pb.h"
#include "services/coordinator/worker_group.h"

namespace mneme::coordinator::testing {

struct FakeWorkerGroupOptions {
  // Ranks. Default: 1.
  int size = 1;
  // What GetInfo reports on every rank.
  // Default: "/fake/checkpoint".
  std::string checkpoint_dir = "/fake/checkpoint";
  // Default: 1000.
  int64_t vocab_size = 1000;
  // Default: 1.
  int64_t eos_token_id = 1;
  // KV cache of a rank. Default: 1 MiB at 16 bytes per token (65536
  // tokens), 16-row blocks, no fixed bytes, no window, DCP 1.
  int64_t kv_bytes_total = int64_t{1} << 20;
  int64_t kv_bytes_per_token = 16;
  int32_t kv_block_rows = 16;
  int64_t kv_fixed_bytes_per_sequence = 0;
  int32_t sliding_window = 0;
  int32_t dcp_size = 1;
  // Like the gRPC group over step streams: StartStep records the step and
  // returns at once; the step runs when waited for (in start order), and a
  // chunk may start with the token its sequence sampled last. Default:
  // false (StartStep runs Step).
  bool pipelined = false;
};

// A deterministic WorkerGroup for the coordinator's unit tests: no workers,
// no network. Info() answers every rank from the options; Step() answers
// every chunk that samples with a token from the token rule (by default
// DefaultToken) and a logprob of -0.5 (with top_logprobs N: the token at
// -0.5, then FakeTopId(k) at -0.5 - k), and every chunk with
// prompt_logprobs with one PositionLogprobs per token (PromptLogprob of the
// position, NaN when the following token is unknown; FakeTopId(k) at
// PromptLogprob - k), and records every request. Ranks start out of a group
// (size > 1) until JoinGroup, like workers. Errors
// can be injected into the next steps or into Info(), and steps can be held
// (Pause) so that a test acts while a step is in flight. Like a worker, it
// refuses (INVALID_ARGUMENT) a chunk that starts with a sampled token its
// sequence does not have at that position. Thread-safe.
class FakeWorkerGroup final : public WorkerGroup {
 public:
  // The token a chunk samples: a function of the sequence and the position
  // of the new token.
  using TokenRule =
      std::function<int64_t(uint64_t sequence_id, int64_t position)>;

  explicit FakeWorkerGroup(FakeWorkerGroupOptions options = {});

  // 100 + position % 800: never the default eos token, always in the
  // default vocabulary.
  static int64_t DefaultToken(uint64_t sequence_id, int64_t position);
  // The fake log-probability of the token after stream position `position`
  // (exact in float for positions below 2^18).
  static float PromptLogprob(int64_t position) {
    return -static_cast<float>(position + 1) / 64;
  }
  // The k-th alternative of a fake top list (k >= 1; entry 0 of a sampled
  // list is the sampled token).
  static int64_t FakeTopId(int k) { return 10 + k; }

  int size() const override { return options_.size; }
  absl::StatusOr<worker::v1::StepResponse> Step(
      const worker::v1::StepRequest& request) override;
  std::unique_ptr<PendingStep> StartStep(
      const worker::v1::StepRequest& request) override;
  bool pipelined() const override { return options_.pipelined; }
  absl::StatusOr<std::vector<worker::v1::GetInfoResponse>> Info() override;
  // Puts every rank in `generation` (recording the call), or fails with the
  // status set by FailNextJoins.
  absl::Status JoinGroup(int64_t generation) override;

  // Rank `rank` reports no group (as after its restart or a broken
  // collective) until the next successful JoinGroup.
  void SetOutOfGroup(int rank);
  // The next `count` JoinGroup calls fail with `status`.
  void FailNextJoins(const absl::Status& status, int count = 1);
  // The generations JoinGroup was called with, in order.
  std::vector<int64_t> joins() const;

  void SetTokenRule(TokenRule rule);
  // The next `count` steps fail with `status` (nothing is sampled).
  void FailNextSteps(const absl::Status& status, int count = 1);
  // Info() fails with `status` until called again with OK.
  void SetInfoStatus(absl::Status status);
  // While paused, Step() waits (after recording its request) until Resume().
  void Pause();
  void Resume();
  // Pauses (as Pause) once the `n`-th step (counting from 1 every step
  // answered so far) is about to run.
  void PauseAt(int n);
  // Steps answered so far.
  int num_answered() const;
  // Waits up to `timeout` until a step waits in Pause; true if one does.
  bool AwaitPausedStep(absl::Duration timeout);
  // Waits up to `timeout` until `n` steps were received in all.
  bool AwaitSteps(int n, absl::Duration timeout);
  // Waits up to `timeout` until `n` steps were answered in all (a pipelined
  // group runs a step only when it is waited for).
  bool AwaitStepsAnswered(int n, absl::Duration timeout);

  // Every request Step() received, in order.
  std::vector<worker::v1::StepRequest> steps() const;
  int num_info_calls() const;

 private:
  class FakePendingStep;
  // Runs a recorded step.
  absl::StatusOr<worker::v1::StepResponse> Run(
      const worker::v1::StepRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const FakeWorkerGroupOptions options_;
  mutable absl::Mutex mu_;
  TokenRule rule_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::Status> step_failures_ ABSL_GUARDED_BY(mu_);
  absl::Status info_status_ ABSL_GUARDED_BY(mu_);
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  int info_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int answered_ ABSL_GUARDED_BY(mu_) = 0;
  int pause_at_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<worker::v1::StepRequest> steps_ ABSL_GUARDED_BY(mu_);
  // Per sequence, the position of the token it sampled last.
  absl::flat_hash_map<uint64_t, int64_t> sampled_ ABSL_GUARDED_BY(mu_);
  // Per rank: in a group, and its generation. A group of one rank is always
  // in a group; larger ones start out of one (as workers do at startup).
  std::vector<bool> in_group_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> generation_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::Status> join_failures_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> joins_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mneme::coordinator::testing

#endif  // MNEME_TESTS_SERVICES_COORDINATOR_FAKE_WORKER_GROUP_H_
