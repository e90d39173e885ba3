// Tokenizer throughput on the DeepSeek-layout test tokenizer
// (tests/text/testdata/deepseek_style.json): bytes of text encoded per
// second, warm and cold word cache, long whitespace runs, decoding.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "benchmark/benchmark.h"
#include "glog/logging.h"
#include "text/incremental_decoder.h"
#include "text/tokenizer.h"

namespace mneme::text {
namespace {

constexpr char kTokenizerPath[] = "tests/text/testdata/deepseek_style.json";

std::unique_ptr<Tokenizer> Load(size_t cache_capacity) {
  TokenizerOptions options;
  options.bpe.cache_capacity = cache_capacity;
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::Create(kTokenizerPath, options);
  CHECK(tokenizer.ok()) << tokenizer.status()
                        << " (run with bazel run from the workspace)";
  return *std::move(tokenizer);
}

// About 64 KiB of prose, code, CJK and emoji.
std::string MixedText() {
  const std::string parts[] = {
      "The quick brown fox jumps over the lazy dog. Serving systems read "
      "prompts, write tokens, and stream text back to the client. ",
      "int main(int argc, char** argv) {\n  for (int i = 0; i < argc; ++i) "
      "{\n    printf(\"%s\\n\", argv[i]);\n  }\n  return 0;\n}\n",
      "中文分词是自然语言处理的基础。日本語のテキストです。한국어 텍스트. ",
      "Emoji 🙂👍🏽🚀 and numbers 3.14159 2026-01-15 1,000,000. ",
  };
  std::string text;
  for (int i = 0; text.size() < size_t{64} * 1024; ++i) text += parts[i % 4];
  return text;
}

void EncodeBench(benchmark::State& state, const std::string& text,
                 size_t cache_capacity) {
  std::unique_ptr<Tokenizer> tokenizer = Load(cache_capacity);
  for (auto _ : state) {
    absl::StatusOr<std::vector<int64_t>> ids =
        tokenizer->Encode(text, AddSpecialTokens::kNo);
    CHECK(ids.ok()) << ids.status();
    benchmark::DoNotOptimize(ids);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(text.size()));
}

void BM_EncodeMixedCached(benchmark::State& state) {
  EncodeBench(state, MixedText(), 10000);
}
BENCHMARK(BM_EncodeMixedCached);

void BM_EncodeMixedUncached(benchmark::State& state) {
  EncodeBench(state, MixedText(), 0);
}
BENCHMARK(BM_EncodeMixedUncached);

// One huge word: 2^k spaces, then a letter.
void BM_EncodeWhitespaceRun(benchmark::State& state) {
  EncodeBench(state, std::string(state.range(0), ' ') + "x", 0);
}
BENCHMARK(BM_EncodeWhitespaceRun)->RangeMultiplier(8)->Range(1 << 10, 1 << 19);

void BM_DecodeMixed(benchmark::State& state) {
  std::unique_ptr<Tokenizer> tokenizer = Load(10000);
  const std::string text = MixedText();
  const std::vector<int64_t> ids =
      *tokenizer->Encode(text, AddSpecialTokens::kNo);
  for (auto _ : state) {
    benchmark::DoNotOptimize(tokenizer->Decode(ids, SkipSpecialTokens::kNo));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(text.size()));
}
BENCHMARK(BM_DecodeMixed);

void BM_IncrementalDecodeMixed(benchmark::State& state) {
  std::unique_ptr<Tokenizer> tokenizer = Load(10000);
  const std::string text = MixedText();
  const std::vector<int64_t> ids =
      *tokenizer->Encode(text, AddSpecialTokens::kNo);
  for (auto _ : state) {
    IncrementalDecoder decoder(*tokenizer, SkipSpecialTokens::kNo);
    for (int64_t id : ids) benchmark::DoNotOptimize(decoder.Add(id));
    benchmark::DoNotOptimize(decoder.Finish());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(ids.size()));
}
BENCHMARK(BM_IncrementalDecodeMixed);

}  // namespace
}  // namespace mneme::text
