#include "services/coordinator/request_stream.h"

#include <utility>

namespace mneme::coordinator {

bool RequestStream::OnTokens(absl::Span<const int64_t> tokens,
                             absl::Span<const float> logprobs) {
  absl::MutexLock lock(&mu_);
  pending_.tokens.insert(pending_.tokens.end(), tokens.begin(), tokens.end());
  pending_.logprobs.insert(pending_.logprobs.end(), logprobs.begin(),
                           logprobs.end());
  ready_ = true;
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
