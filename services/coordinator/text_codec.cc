#include "services/coordinator/text_codec.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/status_macros.h"

namespace mneme::coordinator {
namespace {

// config.json is a few KiB; anything past this is not one.
constexpr uint64_t kMaxConfigBytes = uint64_t{16} << 20;

}  // namespace

absl::Status TextCodec::LoadLocked() {
  if (tokenizer_ != nullptr) return absl::OkStatus();
  std::string path = path_;
  absl::StatusOr<ModelInfo> info = engine_->model_info();
  if (path.empty()) {
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
  // The prompt format's revision is the checkpoint's (its config.json);
  // without one (a tokenizer given before the workers were ready), the
  // template's default.
  if (info.ok()) {
    const std::string config = info->checkpoint + "/config.json";
    absl::StatusOr<std::string> text = ReadSmallFile(config, kMaxConfigBytes);
    if (text.ok()) {
      absl::StatusOr<text::ChatFormat> format = text::DetectChatFormat(*text);
      if (!format.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(config, ": ", format.status().message()));
      }
      options.format = *format;
    } else if (!absl::IsNotFound(text.status())) {
      return text.status();
    }
  }
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
