#include "services/coordinator/text_codec.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mneme::coordinator {

absl::Status TextCodec::LoadLocked() {
  if (tokenizer_ != nullptr) return absl::OkStatus();
  std::string path = path_;
  if (path.empty()) {
    absl::StatusOr<ModelInfo> info = engine_->model_info();
    if (!info.ok()) {
      return absl::FailedPreconditionError(
          "the tokenizer is not loaded yet: the workers have not been ready");
    }
    path = info->checkpoint + "/tokenizer.json";
  }
  ASSIGN_OR_RETURN(std::unique_ptr<text::Tokenizer> t,
                   text::Tokenizer::Create(path));
  text::ChatTemplateOptions options;
  options.missing_special_tokens = text::MissingSpecialTokens::kRenderAsText;
  ASSIGN_OR_RETURN(std::unique_ptr<text::DeepSeekV4ChatTemplate> tmpl,
                   text::DeepSeekV4ChatTemplate::Create(*t, options));
  tokenizer_ = std::move(t);
  template_ = std::move(tmpl);
  return absl::OkStatus();
}

absl::StatusOr<const text::Tokenizer*> TextCodec::tokenizer() {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(LoadLocked());
  return tokenizer_.get();
}

absl::StatusOr<const text::DeepSeekV4ChatTemplate*> TextCodec::chat_template() {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(LoadLocked());
  return template_.get();
}

}  // namespace mneme::coordinator
