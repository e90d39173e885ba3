#ifndef MNEME_TESTS_SERVICES_COORDINATOR_TEST_ENGINE_H_
#define MNEME_TESTS_SERVICES_COORDINATOR_TEST_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics.h"
#include "services/coordinator/engine.h"
#include "services/coordinator/text_codec.h"
#include "tests/services/coordinator/fake_worker_group.h"

namespace mneme::coordinator::testing {

// What the fronts' tests serve: an engine over a FakeWorkerGroup whose
// vocabulary is the synthetic tokenizer's (so its tokens decode), a context
// of `max_context_tokens` (default 256), and a TextCodec over that
// tokenizer. Started and ready
// once Create() returns.
struct TestEngine {
  // Fails when the engine does not get ready within 30 s.
  static absl::StatusOr<std::unique_ptr<TestEngine>> Create(
      EngineOptions options = {}, int64_t max_context_tokens = 256);
  ~TestEngine();

  // The fake's token at `position`: in the synthetic vocabulary, never eos.
  static int64_t Token(int64_t position);

  std::unique_ptr<FakeWorkerGroup> workers;
  std::unique_ptr<MetricsRegistry> metrics;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<TextCodec> codec;
  // The tokenizer.json the codec loads.
  std::string tokenizer_path;
};

}  // namespace mneme::coordinator::testing

#endif  // MNEME_TESTS_SERVICES_COORDINATOR_TEST_ENGINE_H_
