#include "tests/services/coordinator/test_engine.h"

#include <cstdlib>
#include <fstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "tools/synthetic/synthetic_tokenizer.h"

namespace mneme::coordinator::testing {

int64_t TestEngine::Token(int64_t position) {
  // Past the special tokens; the byte and word tokens decode to text.
  return 3 + position % (synthetic::SyntheticVocabSize() - 3);
}

absl::StatusOr<std::unique_ptr<TestEngine>> TestEngine::Create(
    EngineOptions options, int64_t max_context_tokens) {
  auto t = std::make_unique<TestEngine>();
  const char* tmp = std::getenv("TEST_TMPDIR");
  t->tokenizer_path =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/tokenizer.json");
  {
    std::ofstream out(t->tokenizer_path, std::ios::binary | std::ios::trunc);
    out << synthetic::SyntheticTokenizerJson();
    if (!out.good()) {
      return absl::InternalError(
          absl::StrCat("cannot write ", t->tokenizer_path));
    }
  }
  FakeWorkerGroupOptions fake;
  fake.vocab_size = synthetic::SyntheticVocabSize();
  fake.eos_token_id = synthetic::kEosTokenId;
  t->workers = std::make_unique<FakeWorkerGroup>(fake);
  t->workers->SetTokenRule(
      [](uint64_t, int64_t position) { return Token(position); });
  t->metrics = std::make_unique<MetricsRegistry>();
  options.ready_poll_interval = absl::Milliseconds(1);
  options.scheduler.max_context_tokens = max_context_tokens;
  ASSIGN_OR_RETURN(t->engine,
                   Engine::Create(options, t->workers.get(), t->metrics.get()));
  t->engine->Start();
  if (!t->engine->AwaitReady(absl::Seconds(30))) {
    return absl::DeadlineExceededError("the engine did not get ready");
  }
  t->codec = std::make_unique<TextCodec>(t->tokenizer_path, t->engine.get());
  return t;
}

TestEngine::~TestEngine() {
  if (workers != nullptr) workers->Resume();
  if (engine != nullptr) engine->Stop();
}

}  // namespace mneme::coordinator::testing
