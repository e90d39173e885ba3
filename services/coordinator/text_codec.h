#ifndef MNEME_SERVICES_COORDINATOR_TEXT_CODEC_H_
#define MNEME_SERVICES_COORDINATOR_TEXT_CODEC_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/coordinator/engine.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace mneme::coordinator {

// The served model's tokenizer and chat template, for the text APIs.
// Loaded on first use from `tokenizer_path`, or, when that is empty, from
// tokenizer.json in the checkpoint the workers serve (once they have been
// ready). A failed load is retried on the next call. Thread-safe; `engine`
// is borrowed.
class TextCodec {
 public:
  TextCodec(std::string tokenizer_path, const Engine* engine)
      : path_(std::move(tokenizer_path)), engine_(engine) {}

  // FailedPrecondition while the checkpoint is unknown; the loader's errors
  // (NotFound, InvalidArgument naming the file) otherwise.
  absl::StatusOr<const text::Tokenizer*> tokenizer();
  // The chat template over tokenizer(); its special tokens are rendered as
  // text when the tokenizer lacks them.
  absl::StatusOr<const text::DeepSeekV4ChatTemplate*> chat_template();

 private:
  absl::Status LoadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const Engine* const engine_;
  absl::Mutex mu_;
  std::unique_ptr<text::Tokenizer> tokenizer_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<text::DeepSeekV4ChatTemplate> template_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mneme::coordinator

#endif  // MNEME_SERVICES_COORDINATOR_TEXT_CODEC_H_
