#ifndef MNEME_SERVICES_COORDINATOR_REQUEST_STREAM_H_
#define MNEME_SERVICES_COORDINATOR_REQUEST_STREAM_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "services/coordinator/engine.h"

namespace mneme::coordinator {

// Wakes one reader of several RequestStreams (the choices of one HTTP
// request) when any of them has news. Thread-safe.
class Doorbell {
 public:
  void Ring();
  // Waits up to `timeout` for a ring after `seen` (the value a previous call
  // returned; 0 at first); returns the current count.
  uint64_t Wait(uint64_t seen, absl::Duration timeout);

 private:
  absl::Mutex mu_;
  uint64_t rings_ ABSL_GUARDED_BY(mu_) = 0;
};

// A GenerateSink a blocking caller reads from (an HTTP handler thread):
// the engine's thread appends tokens, the caller takes them in batches.
// Bounded by the request's max_new_tokens. Thread-safe.
class RequestStream final : public GenerateSink {
 public:
  struct Batch {
    std::vector<int64_t> tokens;
    std::vector<float> logprobs;
    // Per token, its alternatives (with top_logprobs > 0).
    std::vector<TopLogprobs> top;
    // The prompt's positions (with prompt_logprobs >= 0), in the batch
    // before the first tokens.
    std::vector<TokenLogprobs> prompt;
    // Set once the request has ended (after its last tokens).
    bool finished = false;
    absl::Status status;
    GenerateEnd end = GenerateEnd::kLength;
    int64_t prompt_tokens = 0;
    int64_t completion_tokens = 0;
  };

  RequestStream() = default;
  // Rings `bell` whenever something arrives.
  explicit RequestStream(std::shared_ptr<Doorbell> bell)
      : bell_(std::move(bell)) {}

  void OnPromptLogprobs(absl::Span<const TokenLogprobs> positions) override;
  void OnTopLogprobs(absl::Span<const TopLogprobs> per_token) override;
  bool OnTokens(absl::Span<const int64_t> tokens,
                absl::Span<const float> logprobs) override;
  void OnFinish(const absl::Status& status, GenerateEnd end,
                int64_t prompt_tokens, int64_t completion_tokens) override;

  // Everything that arrived since the last call, waiting up to `timeout`
  // for something (an empty, unfinished batch when nothing came).
  Batch Next(absl::Duration timeout);

 private:
  const std::shared_ptr<Doorbell> bell_;
  absl::Mutex mu_;
  Batch pending_ ABSL_GUARDED_BY(mu_);
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace mneme::coordinator

#endif  // MNEME_SERVICES_COORDINATOR_REQUEST_STREAM_H_
