#include "tests/integration/engram_service_test_util.h"

#include <atomic>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engram_store/client/grpc_engram_client.h"
#include "engram_store/engram_checkpoint.h"
#include "formats/row_decode.h"
#include "gtest/gtest.h"
#include "tests/testing/daemon.h"
#include "tests/testing/subprocess.h"
#include "tools/synthetic/synthetic_checkpoint.h"

namespace mneme::engram::service_testing {

using ::mneme::testing::Daemon;

const std::string& Checkpoint(formats::RowFormat format) {
  static auto* dirs = new std::map<formats::RowFormat, std::string>();
  auto it = dirs->find(format);
  if (it != dirs->end()) return it->second;
  synthetic::SyntheticCheckpointOptions options;
  options.out_dir = mneme::testing::MakeTempDir("service") + "/ckpt";
  options.engram_format = format;
  options.seed = 5;
  options.threads = 2;
  EXPECT_TRUE(synthetic::MakeSyntheticCheckpoint(options).ok());
  return (*dirs)[format] = options.out_dir;
}

Daemon StartDaemon(const std::string& checkpoint,
                   std::vector<std::string> flags) {
  std::vector<std::string> argv = {
      mneme::testing::RunfilePath("mneme/services/engram/mneme_engram_store"),
      "--checkpoint=" + checkpoint,
      "--listen=127.0.0.1:0",
      "--metrics_listen=none",
      "--io_threads=2",
      "--worker_threads=4",
      "--ram_cache_bytes=8388608"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return mneme::testing::StartDaemon(std::move(argv));
}

std::unique_ptr<GrpcEngramClient> Client(const std::string& address,
                                         int max_attempts) {
  GrpcEngramClientOptions options;
  options.target = address;
  options.timeout = absl::Seconds(30);
  options.max_attempts = max_attempts;
  absl::StatusOr<std::unique_ptr<GrpcEngramClient>> client =
      GrpcEngramClient::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

std::string Expected(const EngramCheckpoint& c, int layer,
                     const std::vector<int64_t>& ids, v1::RowEncoding enc) {
  const checkpoint::EngramTableLocation& t = **c.Table(layer);
  std::string raw(ids.size() * formats::RowBytes(t.format), '\0');
  EXPECT_TRUE(
      c.ReadRawRows(
           layer, ids,
           absl::MakeSpan(reinterpret_cast<uint8_t*>(raw.data()), raw.size()))
          .ok());
  if (enc == v1::ROW_ENCODING_RAW) return raw;
  const formats::RowDecodeOptions decode{.format = t.format,
                                         .global_scale = t.global_scale};
  const absl::Span<const uint8_t> in(
      reinterpret_cast<const uint8_t*>(raw.data()), raw.size());
  if (enc == v1::ROW_ENCODING_FP32) {
    std::string out(ids.size() * formats::kRowDim * 4, '\0');
    EXPECT_TRUE(formats::DecodeRowsF32(
                    decode, in,
                    absl::MakeSpan(reinterpret_cast<float*>(out.data()),
                                   ids.size() * formats::kRowDim))
                    .ok());
    return out;
  }
  std::string out(ids.size() * formats::kRowDim * 2, '\0');
  EXPECT_TRUE(formats::DecodeRowsBf16(
                  decode, in,
                  absl::MakeSpan(reinterpret_cast<uint16_t*>(out.data()),
                                 ids.size() * formats::kRowDim))
                  .ok());
  return out;
}

std::vector<int64_t> RandomIds(int64_t rows, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> ids = {0, rows - 1};
  for (int i = 0; i < n; ++i) ids.push_back(rng() % rows);
  ids.push_back(ids[2]);  // A duplicate.
  return ids;
}

std::vector<int64_t> RandomTokens(int64_t vocab, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> tokens;
  tokens.reserve(n);
  for (int i = 0; i < n; ++i) tokens.push_back(rng() % vocab);
  return tokens;
}

std::string Join(const std::vector<int64_t>& v) {
  std::string out;
  for (int64_t x : v) absl::StrAppend(&out, out.empty() ? "" : ",", x);
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void RunLoad(const std::string& address, int threads, int layer, int64_t vocab,
             std::atomic<bool>& stop, LoadResult& result,
             std::atomic<int64_t>& calls) {
  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (int i = 0; i < threads; ++i) {
    workers.emplace_back([&, i] {
      std::unique_ptr<GrpcEngramClient> client = Client(address, 1);
      std::mt19937_64 rng(i);
      std::vector<int64_t> history = RandomTokens(vocab, 3, i);
      while (!stop.load()) {
        // A decode step: three context tokens and one new token; every
        // fourth call a streamed prefill chunk.
        const bool prefill = rng() % 4 == 0;
        const bool before_signal = !result.signalled.load();
        v1::LookupRequest request;
        request.set_layer_id(layer);
        request.mutable_token_ids()->Assign(history.end() - 3, history.end());
        request.set_context_token_count(3);
        const int n = prefill ? 64 : 1;
        for (int t = 0; t < n; ++t) {
          const int64_t token = static_cast<int64_t>(rng() % vocab);
          request.add_token_ids(token);
          history.push_back(token);
        }
        history.erase(history.begin(), history.end() - 3);
        absl::StatusOr<v1::LookupResponse> r =
            prefill ? client->LookupStream(request) : client->Lookup(request);
        if (r.ok() && r->row_ids_size() != n * 24) {
          r = absl::InternalError("wrong row count");
        }
        calls.fetch_add(1);
        absl::MutexLock lock(&result.mu);
        ++result.codes[r.status().code()];
        if (before_signal) ++result.before_signal[r.status().code()];
      }
    });
  }
  for (std::thread& t : workers) t.join();
}

}  // namespace mneme::engram::service_testing
