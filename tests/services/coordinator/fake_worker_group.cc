#include "tests/services/coordinator/fake_worker_group.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace mneme::coordinator::testing {

namespace v1 = worker::v1;

FakeWorkerGroup::FakeWorkerGroup(FakeWorkerGroupOptions options)
    : options_(std::move(options)),
      rule_(&FakeWorkerGroup::DefaultToken),
      in_group_(options_.size, options_.size == 1),
      generation_(options_.size, 0) {}

int64_t FakeWorkerGroup::DefaultToken(uint64_t /*sequence_id*/,
                                      int64_t position) {
  return 100 + position % 800;
}

class FakeWorkerGroup::FakePendingStep final : public PendingStep {
 public:
  FakePendingStep(FakeWorkerGroup* group, v1::StepRequest request)
      : group_(group), request_(std::move(request)) {}
  absl::StatusOr<v1::StepResponse> Wait() override {
    absl::MutexLock lock(&group_->mu_);
    absl::StatusOr<v1::StepResponse> response = group_->Run(request_);
    ++group_->answered_;
    return response;
  }

 private:
  FakeWorkerGroup* const group_;
  const v1::StepRequest request_;
};

std::unique_ptr<WorkerGroup::PendingStep> FakeWorkerGroup::StartStep(
    const v1::StepRequest& request) {
  if (!options_.pipelined) return WorkerGroup::StartStep(request);
  absl::MutexLock lock(&mu_);
  steps_.push_back(request);
  return std::make_unique<FakePendingStep>(this, request);
}

absl::StatusOr<v1::StepResponse> FakeWorkerGroup::Step(
    const v1::StepRequest& request) {
  absl::MutexLock lock(&mu_);
  steps_.push_back(request);
  absl::StatusOr<v1::StepResponse> response = Run(request);
  ++answered_;
  return response;
}

absl::StatusOr<v1::StepResponse> FakeWorkerGroup::Run(
    const v1::StepRequest& request) {
  if (pause_at_ > 0 && answered_ + 1 >= pause_at_) {
    paused_ = true;
    pause_at_ = 0;
  }
  ++waiting_;
  mu_.Await(absl::Condition(
      +[](bool* paused) { return !*paused; }, &paused_));
  --waiting_;
  for (int r = 0; r < options_.size; ++r) {
    if (!in_group_[r]) {
      return absl::UnavailableError(
          absl::StrCat("worker ", r, ": in no tensor-parallel group"));
    }
  }
  if (!step_failures_.empty()) {
    absl::Status st = std::move(step_failures_.front());
    step_failures_.pop_front();
    return st;
  }
  for (const uint64_t id : request.release_sequence_ids()) sampled_.erase(id);
  for (const v1::SequenceChunk& c : request.chunks()) {
    if (!c.starts_with_sampled_token()) continue;
    const auto it = sampled_.find(c.sequence_id());
    if (it == sampled_.end() || it->second != c.start_position()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", c.sequence_id(), " has no sampled token at position ",
          c.start_position()));
    }
  }
  v1::StepResponse response;
  response.set_step_id(request.step_id());
  for (const v1::SequenceChunk& c : request.chunks()) {
    v1::ChunkResult* r = response.add_results();
    r->set_sequence_id(c.sequence_id());
    const int64_t length = c.start_position() + c.token_ids_size() +
                           (c.starts_with_sampled_token() ? 1 : 0);
    if (c.output() == v1::OUTPUT_SAMPLE) {
      const int64_t token = rule_(c.sequence_id(), length);
      sampled_[c.sequence_id()] = length;
      r->set_token_id(token);
      r->set_logprob(-0.5f);
      for (int k = 0; k < c.top_logprobs(); ++k) {
        r->add_top_ids(k == 0 ? token : FakeTopId(k));
        r->add_top_logprobs(-0.5f - static_cast<float>(k));
      }
    }
    if (c.prompt_logprobs()) {
      for (int j = 0; j < c.token_ids_size(); ++j) {
        const bool known = j + 1 < c.token_ids_size() ||
                           (c.has_next_token_id() && c.next_token_id() >= 0);
        const float lp = PromptLogprob(c.start_position() + j);
        v1::PositionLogprobs* p = r->add_positions();
        p->set_target_logprob(known ? lp
                                    : std::numeric_limits<float>::quiet_NaN());
        for (int k = 0; k < c.top_logprobs(); ++k) {
          p->add_top_ids(FakeTopId(k));
          p->add_top_logprobs(lp - static_cast<float>(k));
        }
      }
    }
  }
  return response;
}

absl::StatusOr<std::vector<v1::GetInfoResponse>> FakeWorkerGroup::Info() {
  absl::MutexLock lock(&mu_);
  ++info_calls_;
  if (!info_status_.ok()) return info_status_;
  std::vector<v1::GetInfoResponse> out(options_.size);
  for (int r = 0; r < options_.size; ++r) {
    v1::GetInfoResponse& i = out[r];
    i.set_rank(r);
    i.set_tp_size(options_.size);
    i.set_backend("fake");
    i.set_checkpoint_dir(options_.checkpoint_dir);
    i.set_vocab_size(options_.vocab_size);
    i.set_eos_token_id(options_.eos_token_id);
    i.set_kv_block_rows(options_.kv_block_rows);
    i.set_ready(true);
    i.set_kv_bytes_total(options_.kv_bytes_total);
    i.set_kv_fixed_bytes_per_sequence(options_.kv_fixed_bytes_per_sequence);
    i.set_kv_bytes_per_token(options_.kv_bytes_per_token);
    i.set_dcp_size(options_.dcp_size);
    i.set_dcp_interleave(1);
    i.set_sliding_window(options_.sliding_window);
    i.set_in_group(in_group_[r]);
    i.set_group_generation(generation_[r]);
  }
  return out;
}

absl::Status FakeWorkerGroup::JoinGroup(int64_t generation) {
  absl::MutexLock lock(&mu_);
  joins_.push_back(generation);
  sampled_.clear();
  for (int r = 0; r < options_.size; ++r) {
    generation_[r] = generation;
    in_group_[r] = join_failures_.empty();
  }
  if (!join_failures_.empty()) {
    absl::Status st = std::move(join_failures_.front());
    join_failures_.pop_front();
    return st;
  }
  return absl::OkStatus();
}

void FakeWorkerGroup::SetOutOfGroup(int rank) {
  absl::MutexLock lock(&mu_);
  in_group_.at(rank) = false;
}

void FakeWorkerGroup::FailNextJoins(const absl::Status& status, int count) {
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < count; ++i) join_failures_.push_back(status);
}

std::vector<int64_t> FakeWorkerGroup::joins() const {
  absl::MutexLock lock(&mu_);
  return joins_;
}

void FakeWorkerGroup::SetTokenRule(TokenRule rule) {
  absl::MutexLock lock(&mu_);
  rule_ = std::move(rule);
}

void FakeWorkerGroup::FailNextSteps(const absl::Status& status, int count) {
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < count; ++i) step_failures_.push_back(status);
}

void FakeWorkerGroup::SetInfoStatus(absl::Status status) {
  absl::MutexLock lock(&mu_);
  info_status_ = std::move(status);
}

void FakeWorkerGroup::Pause() {
  absl::MutexLock lock(&mu_);
  paused_ = true;
}

void FakeWorkerGroup::PauseAt(int n) {
  absl::MutexLock lock(&mu_);
  pause_at_ = n;
}

int FakeWorkerGroup::num_answered() const {
  absl::MutexLock lock(&mu_);
  return answered_;
}

void FakeWorkerGroup::Resume() {
  absl::MutexLock lock(&mu_);
  paused_ = false;
}

bool FakeWorkerGroup::AwaitPausedStep(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto cond = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return waiting_ > 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&cond), timeout);
}

bool FakeWorkerGroup::AwaitSteps(int n, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto cond = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(steps_.size()) >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&cond), timeout);
}

bool FakeWorkerGroup::AwaitStepsAnswered(int n, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto cond = [this, n]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return answered_ >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&cond), timeout);
}

std::vector<v1::StepRequest> FakeWorkerGroup::steps() const {
  absl::MutexLock lock(&mu_);
  return steps_;
}

int FakeWorkerGroup::num_info_calls() const {
  absl::MutexLock lock(&mu_);
  return info_calls_;
}

}  // namespace mneme::coordinator::testing
