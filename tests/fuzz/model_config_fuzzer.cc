// libFuzzer target for a checkpoint's config.json: the input through
// checkpoint::ModelConfig::Parse (and the getters the model reads it with),
// checkpoint::EditConfigJsonText (which writes the document back) and
// text::DetectChatFormat. Each must accept or refuse - a refusal naming the
// file - and never crash.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/config_json_edit.h"
#include "checkpoint/model_config.h"
#include "nlohmann/json.hpp"
#include "text/chat_template.h"

namespace {

using ::mneme::checkpoint::ModelConfig;

constexpr char kFileName[] = "fuzz/config.json";

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "invariant violated: %s\n", what);
  std::abort();
}

void CheckRefusal(const absl::Status& status) {
  if (status.ok()) return;
  if (status.message().find(kFileName) == absl::string_view::npos) {
    Fail("refusal does not name the file");
  }
}

void ReadFields(const ModelConfig& config) {
  for (const char* key :
       {"vocab_size", "hidden_size", "num_hidden_layers", "n_routed_experts",
        "num_experts_per_tok", "rope_theta", "model_type",
        "quantization_config", "engram_layer_ids", "tie_word_embeddings"}) {
    (void)config.GetInt(key);
    (void)config.GetDouble(key);
    (void)config.GetString(key);
    (void)config.GetBool(key);
    (void)config.GetIntInRange(key, 0, 1 << 20);
    (void)config.GetIntArray(key, 0, 1 << 20);
    (void)config.KeyPath(key);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::unique_ptr<ModelConfig>> config =
      ModelConfig::Parse(input, kFileName);
  CheckRefusal(config.status());
  if (config.ok()) ReadFields(**config);

  for (const absl::string_view marker : {"", "num_hidden_layers"}) {
    absl::StatusOr<std::string> edited = mneme::checkpoint::EditConfigJsonText(
        input, kFileName, marker, [](nlohmann::ordered_json& section) {
          section["quantization_config"] = {{"quant_method", "fp8"}};
        });
    CheckRefusal(edited.status());
    // An edit keeps a config the model accepts acceptable.
    if (config.ok() && edited.ok() &&
        !ModelConfig::Parse(*edited, kFileName).ok()) {
      Fail("an edited valid config does not parse again");
    }
  }
  (void)mneme::text::DetectChatFormat(
      std::string_view(input.data(), input.size()));
  return 0;
}
