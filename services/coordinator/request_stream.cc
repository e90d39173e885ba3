#include "services/coordinator/request_stream.h"

#include <utility>

namespace mneme::coordinator {

void Doorbell::Ring() {
  absl::MutexLock lock(&mu_);
  ++rings_;
}

uint64_t Doorbell::Wait(uint64_t seen, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto rang = [this, seen]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return rings_ != seen; };
  mu_.AwaitWithTimeout(absl::Condition(&rang), timeout);
  return rings_;
}

void RequestStream::OnPromptLogprobs(
    absl::Span<const TokenLogprobs> positions) {
  absl::MutexLock lock(&mu_);
  pending_.prompt.insert(pending_.prompt.end(), positions.begin(),
                         positions.end());
}

void RequestStream::OnTopLogprobs(absl::Span<const TopLogprobs> per_token) {
  absl::MutexLock lock(&mu_);
  pending_.top.insert(pending_.top.end(), per_token.begin(), per_token.end());
}

bool RequestStream::OnTokens(absl::Span<const int64_t> tokens,
                             absl::Span<const float> logprobs) {
  absl::MutexLock lock(&mu_);
  pending_.tokens.insert(pending_.tokens.end(), tokens.begin(), tokens.end());
  pending_.logprobs.insert(pending_.logprobs.end(), logprobs.begin(),
                           logprobs.end());
  ready_ = true;
  if (bell_ != nullptr) bell_->Ring();
  return true;
}

void RequestStream::OnFinish(const absl::Status& status, GenerateEnd end,
                             int64_t prompt_tokens, int64_t completion_tokens) {
  absl::MutexLock lock(&mu_);
  pending_.finished = true;
  pending_.status = status;
  pending_.end = end;
  pending_.prompt_tokens = prompt_tokens;
  pending_.completion_tokens = completion_tokens;
  ready_ = true;
  if (bell_ != nullptr) bell_->Ring();
}

RequestStream::Batch RequestStream::Next(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&ready_), timeout);
  Batch out = std::move(pending_);
  const bool finished = out.finished;
  pending_ = Batch();
  // A finished stream stays finished for later calls.
  pending_.finished = finished;
  pending_.status = out.status;
  pending_.end = out.end;
  pending_.prompt_tokens = out.prompt_tokens;
  pending_.completion_tokens = out.completion_tokens;
  ready_ = finished;
  return out;
}

}  // namespace mneme::coordinator
