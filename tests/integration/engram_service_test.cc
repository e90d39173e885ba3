// Starts the real mneme_engram_store daemon on 127.0.0.1:0 over synthetic
// checkpoints and checks it through the C++ gRPC client: rows identical to
// direct decoding (both formats, by ids and by tokens, unary and streamed),
// specific codes for bad requests while the daemon keeps serving, mutual
// TLS, concurrent load and SIGTERM during load.

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engram_store/client/grpc_engram_client.h"
#include "engram_store/engram_checkpoint.h"
#include "engram_store/engram_store.h"
#include "formats/row_decode.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/testing/daemon.h"
#include "tests/testing/notify_socket.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tls_certs.h"
#include "tools/synthetic/synthetic_checkpoint.h"

namespace mneme::engram {
namespace {

using ::mneme::testing::Subprocess;

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

using ::mneme::testing::Daemon;

Daemon StartDaemon(const std::string& checkpoint,
                   std::vector<std::string> flags = {}) {
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
                                         int max_attempts = 4) {
  GrpcEngramClientOptions options;
  options.target = address;
  options.timeout = absl::Seconds(30);
  options.max_attempts = max_attempts;
  absl::StatusOr<std::unique_ptr<GrpcEngramClient>> client =
      GrpcEngramClient::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// Direct reads of the checkpoint, decoded by the format library.
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
  for (int i = 0; i < n; ++i) tokens.push_back(rng() % vocab);
  return tokens;
}

class EngramServiceTest : public ::testing::TestWithParam<formats::RowFormat> {
};

TEST_P(EngramServiceTest, RowsMatchDirectDecodingByIdsAndTokens) {
  const std::string& dir = Checkpoint(GetParam());
  absl::StatusOr<std::unique_ptr<EngramCheckpoint>> ckpt =
      EngramCheckpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  // Small stream messages so that LookupStream sends many.
  Daemon d = StartDaemon(dir, {"--max_stream_message_bytes=20000"});
  ASSERT_FALSE(d.address.empty());
  std::unique_ptr<GrpcEngramClient> client = Client(d.address);
  ASSERT_NE(client, nullptr);

  absl::StatusOr<v1::DescribeResponse> describe = client->Describe();
  ASSERT_TRUE(describe.ok()) << describe.status();
  ASSERT_EQ(describe->tables_size(),
            static_cast<int>((*ckpt)->tables().size()));
  EXPECT_EQ(describe->num_columns(), (*ckpt)->hasher().num_columns());
  EXPECT_EQ(describe->columns_size(), (*ckpt)->hasher().num_columns());

  const int64_t vocab = (*ckpt)->hasher().vocabulary().num_tokens();
  for (const v1::TableInfo& table : describe->tables()) {
    const int layer = table.layer_id();
    const LayerHashLayout& layout =
        (*ckpt)
            ->hasher()
            .layout()
            .layers()[*(*ckpt)->hasher().layout().LayerIndex(layer)];
    EXPECT_EQ(std::vector<int64_t>(table.multipliers().begin(),
                                   table.multipliers().end()),
              layout.multipliers);
    EXPECT_EQ(table.rows(), (*(*ckpt)->Table(layer))->rows);
    for (v1::RowEncoding enc :
         {v1::ROW_ENCODING_UNSPECIFIED, v1::ROW_ENCODING_BF16,
          v1::ROW_ENCODING_FP32, v1::ROW_ENCODING_RAW}) {
      SCOPED_TRACE(absl::StrCat("layer ", layer, " encoding ", enc));
      const v1::RowEncoding effective =
          enc == v1::ROW_ENCODING_UNSPECIFIED ? v1::ROW_ENCODING_BF16 : enc;
      // By ids, unary and streamed.
      const std::vector<int64_t> ids = RandomIds(table.rows(), 200, layer);
      v1::LookupRequest request;
      request.set_layer_id(layer);
      request.mutable_row_ids()->Assign(ids.begin(), ids.end());
      request.set_encoding(enc);
      const std::string expected = Expected(**ckpt, layer, ids, effective);
      absl::StatusOr<v1::LookupResponse> r = client->Lookup(request);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->encoding(), effective);
      EXPECT_EQ(r->row_dim(), formats::kRowDim);
      EXPECT_EQ(r->row_bytes() * ids.size(), expected.size());
      EXPECT_TRUE(r->rows() == expected);
      EXPECT_EQ(std::vector<int64_t>(r->row_ids().begin(), r->row_ids().end()),
                ids);
      absl::StatusOr<v1::LookupResponse> s = client->LookupStream(request);
      ASSERT_TRUE(s.ok()) << s.status();
      EXPECT_TRUE(s->rows() == expected);

      // By tokens: a window after three context tokens, all columns.
      const std::vector<int64_t> tokens = RandomTokens(vocab, 40, layer + 7);
      v1::LookupRequest by_tokens;
      by_tokens.set_layer_id(layer);
      by_tokens.mutable_token_ids()->Assign(tokens.begin(), tokens.end());
      by_tokens.set_context_token_count(3);
      by_tokens.set_encoding(enc);
      absl::StatusOr<std::vector<int64_t>> token_rows =
          (*ckpt)->hasher().RowIds(layer,
                                   std::span<const int64_t>(tokens).first(3),
                                   std::span<const int64_t>(tokens).subspan(3));
      ASSERT_TRUE(token_rows.ok()) << token_rows.status();
      absl::StatusOr<v1::LookupResponse> t = client->Lookup(by_tokens);
      ASSERT_TRUE(t.ok()) << t.status();
      EXPECT_EQ(std::vector<int64_t>(t->row_ids().begin(), t->row_ids().end()),
                *token_rows);
      EXPECT_TRUE(t->rows() == Expected(**ckpt, layer, *token_rows, effective));
      absl::StatusOr<v1::LookupResponse> ts = client->LookupStream(by_tokens);
      ASSERT_TRUE(ts.ok()) << ts.status();
      EXPECT_TRUE(ts->rows() == t->rows());

      // A subset of columns, in the order given.
      by_tokens.add_columns(5);
      by_tokens.add_columns(0);
      absl::StatusOr<v1::LookupResponse> c = client->Lookup(by_tokens);
      ASSERT_TRUE(c.ok()) << c.status();
      ASSERT_EQ(c->row_ids_size(), 2 * 37);
      for (int p = 0; p < 37; ++p) {
        EXPECT_EQ(c->row_ids(2 * p), (*token_rows)[p * 24 + 5]);
        EXPECT_EQ(c->row_ids(2 * p + 1), (*token_rows)[p * 24 + 0]);
      }
    }
  }
  v1::PrefetchRequest prefetch;
  prefetch.set_layer_id(describe->tables(0).layer_id());
  prefetch.add_row_ids(1);
  prefetch.add_row_ids(2);
  absl::StatusOr<v1::PrefetchResponse> p = client->Prefetch(prefetch);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_LE(p->rows_queued(), 2);
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

// Runs the Python example client; its JSON stdout line.
std::string RunPython(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {
      "/usr/bin/python3",
      mneme::testing::RunfilePath("mneme/tools/python/engram_client.py"),
      "--proto_root=" + mneme::testing::RunfilePath("mneme"),
      absl::StrCat("--stubs_dir=", std::getenv("TEST_TMPDIR"), "/py_stubs")};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(argv);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return "";
  absl::StatusOr<int> code = (*p)->Wait(absl::Seconds(120));
  EXPECT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(code.value_or(-1), 0) << (*p)->Stdout() << (*p)->Stderr();
  return (*p)->Stdout();
}

TEST_P(EngramServiceTest, PythonClientRowsMatchDirectDecoding) {
  const std::string& dir = Checkpoint(GetParam());
  absl::StatusOr<std::unique_ptr<EngramCheckpoint>> ckpt =
      EngramCheckpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  Daemon d = StartDaemon(dir, {"--max_stream_message_bytes=5000"});
  ASSERT_FALSE(d.address.empty());
  const std::string out =
      absl::StrCat(std::getenv("TEST_TMPDIR"), "/python_rows.bin");
  const int64_t vocab = (*ckpt)->hasher().vocabulary().num_tokens();
  for (const checkpoint::EngramTableLocation& table : (*ckpt)->tables()) {
    const std::vector<int64_t> ids = RandomIds(table.rows, 50, 3);
    for (const auto& [flag, enc] :
         std::vector<std::pair<std::string, v1::RowEncoding>>{
             {"bf16", v1::ROW_ENCODING_BF16},
             {"fp32", v1::ROW_ENCODING_FP32},
             {"raw", v1::ROW_ENCODING_RAW}}) {
      SCOPED_TRACE(absl::StrCat("layer ", table.layer, " ", flag));
      const std::string json = RunPython(
          {"--server=" + d.address, absl::StrCat("--layer=", table.layer),
           "--ids=" + Join(ids), "--encoding=" + flag, "--out=" + out});
      EXPECT_NE(json.find("\"row_ids\": [" +
                          absl::StrReplaceAll(Join(ids), {{",", ", "}})),
                std::string::npos)
          << json;
      EXPECT_TRUE(ReadFile(out) == Expected(**ckpt, table.layer, ids, enc));
    }
    const std::vector<int64_t> tokens = RandomTokens(vocab, 20, 11);
    absl::StatusOr<std::vector<int64_t>> token_rows = (*ckpt)->hasher().RowIds(
        table.layer, std::span<const int64_t>(tokens).first(3),
        std::span<const int64_t>(tokens).subspan(3));
    ASSERT_TRUE(token_rows.ok());
    const std::string expected =
        Expected(**ckpt, table.layer, *token_rows, v1::ROW_ENCODING_BF16);
    for (const char* stream : {"--stream=false", "--stream"}) {
      std::vector<std::string> args = {
          "--server=" + d.address, absl::StrCat("--layer=", table.layer),
          "--tokens=" + Join(tokens), "--context=3", "--out=" + out};
      if (std::string(stream) == "--stream") args.push_back(stream);
      const std::string json = RunPython(args);
      EXPECT_NE(
          json.find("\"row_ids\": [" +
                    absl::StrReplaceAll(Join(*token_rows), {{",", ", "}})),
          std::string::npos)
          << json;
      EXPECT_TRUE(ReadFile(out) == expected);
    }
  }
}

// Runs the mneme CLI; its stdout.
std::string RunCli(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {
      mneme::testing::RunfilePath("mneme/tools/mneme")};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(argv);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return "";
  absl::StatusOr<int> code = (*p)->Wait(absl::Seconds(120));
  EXPECT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(code.value_or(-1), 0) << (*p)->Stderr();
  return (*p)->Stdout();
}

TEST_P(EngramServiceTest, CliLookupAndBenchAgainstTheDaemon) {
  const std::string& dir = Checkpoint(GetParam());
  absl::StatusOr<std::unique_ptr<EngramCheckpoint>> ckpt =
      EngramCheckpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  Daemon d = StartDaemon(dir);
  ASSERT_FALSE(d.address.empty());
  const checkpoint::EngramTableLocation& table = (*ckpt)->tables()[0];
  const std::vector<int64_t> ids = {0, 7, table.rows - 1};
  const std::string text = RunCli({"engram", "lookup", "--server", d.address,
                                   "--layer", absl::StrCat(table.layer),
                                   "--ids", Join(ids), "--encoding", "fp32"});
  const std::string expected =
      Expected(**ckpt, table.layer, ids, v1::ROW_ENCODING_FP32);
  std::string lines;
  for (size_t r = 0; r < ids.size(); ++r) {
    absl::StrAppend(&lines, ids[r], ":");
    for (int i = 0; i < formats::kRowDim; ++i) {
      float v = 0;
      std::memcpy(&v, expected.data() + (r * formats::kRowDim + i) * 4, 4);
      char buf[32];
      std::snprintf(buf, sizeof(buf), " %.9g", v);
      lines += buf;
    }
    lines += "\n";
  }
  EXPECT_EQ(text, lines);

  const std::string bench =
      RunCli({"bench", "engram-service", "--server", d.address, "--layer",
              absl::StrCat(table.layer), "--streams", "4", "--duration-s", "1",
              "--vocab-size",
              absl::StrCat((*ckpt)->hasher().vocabulary().num_tokens())});
  EXPECT_NE(bench.find("\"errors\":0,"), std::string::npos) << bench;
  EXPECT_NE(bench.find("\"p99_ms\":"), std::string::npos) << bench;
}

INSTANTIATE_TEST_SUITE_P(Formats, EngramServiceTest,
                         ::testing::Values(formats::RowFormat::kFp8,
                                           formats::RowFormat::kNvfp4),
                         [](const auto& info) {
                           return info.param == formats::RowFormat::kFp8
                                      ? "Fp8"
                                      : "Nvfp4";
                         });

absl::StatusCode Code(GrpcEngramClient& client,
                      const v1::LookupRequest& request) {
  return client.Lookup(request).status().code();
}

TEST(EngramServiceErrors, BadRequestsGetSpecificCodesAndServingContinues) {
  const std::string& dir = Checkpoint(formats::RowFormat::kFp8);
  absl::StatusOr<std::unique_ptr<EngramCheckpoint>> ckpt =
      EngramCheckpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  // Rank 0 of TP 2: half of the columns.
  Daemon d = StartDaemon(dir, {"--max_rows_per_request=100", "--tp_size=2",
                               "--ranks=0", "--column_split=contiguous"});
  ASSERT_FALSE(d.address.empty());
  std::unique_ptr<GrpcEngramClient> client = Client(d.address);
  const int layer = (*ckpt)->tables()[0].layer;
  const int64_t rows = (*ckpt)->tables()[0].rows;
  const LayerHashLayout& layout = (*ckpt)->hasher().layout().layers()[0];

  v1::LookupRequest good;
  good.set_layer_id(layer);
  good.add_row_ids(0);
  ASSERT_TRUE(client->Lookup(good).ok());

  v1::LookupRequest r = good;
  r.set_layer_id(999);
  EXPECT_EQ(Code(*client, r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.set_row_ids(0, rows);
  EXPECT_EQ(Code(*client, r), absl::StatusCode::kOutOfRange);
  r = good;
  r.set_row_ids(0, -1);
  EXPECT_EQ(Code(*client, r), absl::StatusCode::kOutOfRange);
  r = good;  // The last column belongs to rank 1.
  r.set_row_ids(0, layout.offsets.back());
  EXPECT_EQ(Code(*client, r), absl::StatusCode::kOutOfRange);
  r = good;
  for (int i = 0; i < 100; ++i) r.add_row_ids(i);
  EXPECT_EQ(Code(*client, r), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(client->LookupStream(r).status().code(), absl::StatusCode::kOk);
  r = good;
  r.clear_row_ids();
  EXPECT_EQ(Code(*client, r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.add_token_ids(5);
  EXPECT_EQ(Code(*client, r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.set_encoding(static_cast<v1::RowEncoding>(42));
  EXPECT_EQ(Code(*client, r), absl::StatusCode::kInvalidArgument);

  v1::LookupRequest tokens;
  tokens.set_layer_id(layer);
  tokens.add_token_ids(10);
  tokens.add_token_ids(11);
  tokens.add_token_ids(12);
  ASSERT_TRUE(client->Lookup(tokens).ok());
  r = tokens;  // Only context: an empty window.
  r.set_context_token_count(3);
  EXPECT_EQ(Code(*client, r), absl::StatusCode::kInvalidArgument);
  r.set_context_token_count(-1);
  EXPECT_EQ(Code(*client, r), absl::StatusCode::kInvalidArgument);
  r.set_context_token_count(7);
  EXPECT_EQ(Code(*client, r), absl::StatusCode::kInvalidArgument);
  r = tokens;
  r.add_columns(24);
  EXPECT_EQ(Code(*client, r), absl::StatusCode::kInvalidArgument);
  r = tokens;
  r.add_columns(1);
  r.add_columns(1);
  EXPECT_EQ(Code(*client, r), absl::StatusCode::kInvalidArgument);
  r = tokens;
  r.add_columns(23);  // Rank 1's.
  EXPECT_EQ(Code(*client, r), absl::StatusCode::kOutOfRange);
  r = tokens;
  r.set_token_ids(1, int64_t{1} << 40);
  EXPECT_EQ(Code(*client, r), absl::StatusCode::kOutOfRange);
  r = tokens;  // 5 tokens x 12 columns > 100 rows.
  for (int i = 0; i < 6; ++i) r.add_token_ids(i);
  EXPECT_EQ(Code(*client, r), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(client->LookupStream(r).status().code(), absl::StatusCode::kOk);

  v1::PrefetchRequest prefetch;
  prefetch.set_layer_id(999);
  prefetch.add_row_ids(0);
  EXPECT_EQ(client->Prefetch(prefetch).status().code(),
            absl::StatusCode::kInvalidArgument);

  // Still serving.
  absl::StatusOr<v1::LookupResponse> after = client->Lookup(tokens);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->row_ids_size(), 3 * 12);
}

TEST(EngramServiceSecurity, MutualTlsRefusesClientsWithoutCertificate) {
  absl::StatusOr<mneme::testing::TlsCerts> certs =
      mneme::testing::GenerateTlsCerts();
  ASSERT_TRUE(certs.ok()) << certs.status();
  Daemon d = StartDaemon(
      Checkpoint(formats::RowFormat::kFp8),
      {"--tls_cert=" + certs->server_cert, "--tls_key=" + certs->server_key,
       "--tls_client_ca=" + certs->ca_cert});
  ASSERT_FALSE(d.address.empty());
  GrpcEngramClientOptions options;
  options.target = d.address;
  options.timeout = absl::Seconds(10);
  options.max_attempts = 1;
  options.tls.ca_file = certs->ca_cert;
  options.tls.server_name_override = "localhost";

  std::unique_ptr<GrpcEngramClient> without =
      *GrpcEngramClient::Create(options);
  EXPECT_EQ(without->Describe().status().code(),
            absl::StatusCode::kUnavailable);

  options.tls.cert_file = certs->client_cert;
  options.tls.key_file = certs->client_key;
  std::unique_ptr<GrpcEngramClient> with = *GrpcEngramClient::Create(options);
  absl::StatusOr<v1::DescribeResponse> describe = with->Describe();
  EXPECT_TRUE(describe.ok()) << describe.status();

  // A plaintext client is refused too.
  std::unique_ptr<GrpcEngramClient> plain = Client(d.address, 1);
  EXPECT_EQ(plain->Describe().status().code(), absl::StatusCode::kUnavailable);
}

// Runs `threads` client loops against `address` until `stop`; records every
// status code seen.
struct LoadResult {
  absl::Mutex mu;
  std::map<absl::StatusCode, int64_t> codes ABSL_GUARDED_BY(mu);
  // Codes of the calls started before `signalled` was set.
  std::map<absl::StatusCode, int64_t> before_signal ABSL_GUARDED_BY(mu);
  std::atomic<bool> signalled = false;
};

void RunLoad(const std::string& address, int threads, int layer, int64_t vocab,
             std::atomic<bool>& stop, LoadResult& result,
             std::atomic<int64_t>& calls) {
  std::vector<std::thread> workers;
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

TEST(EngramServiceLoad, SixtyFourConcurrentStreamsWithoutErrors) {
  const std::string& dir = Checkpoint(formats::RowFormat::kFp8);
  absl::StatusOr<std::unique_ptr<EngramCheckpoint>> ckpt =
      EngramCheckpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  Daemon d = StartDaemon(dir);
  ASSERT_FALSE(d.address.empty());
  std::atomic<bool> stop = false;
  std::atomic<int64_t> calls = 0;
  LoadResult result;
  std::thread load([&] {
    RunLoad(d.address, 64, (*ckpt)->tables()[0].layer,
            (*ckpt)->hasher().vocabulary().num_tokens(), stop, result, calls);
  });
  absl::SleepFor(absl::Seconds(2));
  stop = true;
  load.join();
  absl::MutexLock lock(&result.mu);
  EXPECT_EQ(result.codes.size(), 1u);
  EXPECT_GT(result.codes[absl::StatusCode::kOk], 0);
  d.process->Signal(SIGTERM);
  absl::StatusOr<int> code = d.process->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

// Resident memory of a process, from /proc/PID/status (VmRSS), in bytes.
int64_t ResidentBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "VmRSS:")) {
      int64_t kib = 0;
      std::sscanf(line.c_str(), "VmRSS: %ld", &kib);
      return kib * 1024;
    }
  }
  return -1;
}

// The value of an unlabelled series in Prometheus text.
double MetricValue(const std::string& text, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, name + " ")) {
      double value = -1;
      EXPECT_TRUE(absl::SimpleAtod(line.substr(name.size() + 1), &value));
      return value;
    }
  }
  ADD_FAILURE() << "no series " << name;
  return -1;
}

TEST(EngramServiceLoad, MemoryStaysWithinBudgetUnderLoad) {
  const std::string& dir = Checkpoint(formats::RowFormat::kNvfp4);
  absl::StatusOr<std::unique_ptr<EngramCheckpoint>> ckpt =
      EngramCheckpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  Daemon d = StartDaemon(dir, {"--metrics_listen=127.0.0.1:0"});
  ASSERT_FALSE(d.address.empty());
  absl::StatusOr<std::string> line =
      d.process->WaitForStdoutLine("metrics on ", absl::Seconds(30));
  ASSERT_TRUE(line.ok()) << line.status();
  int metrics_port = 0;
  ASSERT_TRUE(
      absl::SimpleAtoi(line->substr(line->rfind(':') + 1), &metrics_port));
  const int64_t rss_before = ResidentBytes(d.process->pid());
  std::atomic<bool> stop = false;
  std::atomic<int64_t> calls = 0;
  LoadResult result;
  std::thread load([&] {
    RunLoad(d.address, 64, (*ckpt)->tables()[0].layer,
            (*ckpt)->hasher().vocabulary().num_tokens(), stop, result, calls);
  });
  httplib::Client http("127.0.0.1", metrics_port);
  http.set_read_timeout(10, 0);
  int64_t rss_peak = rss_before;
  for (int i = 0; i < 10; ++i) {
    absl::SleepFor(absl::Milliseconds(200));
    rss_peak = std::max(rss_peak, ResidentBytes(d.process->pid()));
    httplib::Result scrape = http.Get("/metrics");
    ASSERT_TRUE(scrape);
    // The RAM cache never holds more than its 8 MiB budget.
    EXPECT_LE(MetricValue(scrape->body, "mneme_engram_ram_cache_bytes"),
              MetricValue(scrape->body, "mneme_engram_ram_cache_budget_bytes"));
  }
  stop = true;
  load.join();
  EXPECT_GT(calls.load(), 0);
  // Everything the daemon allocates per request is bounded (work queue, row
  // limits, stream message size, cache budget): 64 streams may add thread
  // and buffer memory, not growth with traffic.
  EXPECT_LT(rss_peak - rss_before, int64_t{256} << 20)
      << "RSS " << rss_before << " -> " << rss_peak;
  d.process->Signal(SIGTERM);
  absl::StatusOr<int> code = d.process->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0);
}

TEST(EngramServiceReadiness, ReadyOnlyAfterTheTablesOpen) {
  const std::string& dir = Checkpoint(formats::RowFormat::kFp8);
  {
    mneme::testing::NotifySocket notify;
    ASSERT_TRUE(notify.bound());
    std::vector<std::string> argv = {
        mneme::testing::RunfilePath("mneme/services/engram/mneme_engram_store"),
        "--checkpoint=" + dir, "--listen=127.0.0.1:0", "--metrics_listen=none"};
    auto p = Subprocess::Start(argv, {{"NOTIFY_SOCKET", notify.env_value()},
                                      {"WATCHDOG_USEC", "200000"}});
    ASSERT_TRUE(p.ok());
    EXPECT_TRUE(notify.WaitFor("READY=1", absl::Seconds(60)));
    EXPECT_TRUE(
        (*p)->WaitForStdoutLine("listening on ", absl::Seconds(10)).ok());
    EXPECT_TRUE(notify.WaitFor("WATCHDOG=1", absl::Seconds(10)));
    (*p)->Signal(SIGTERM);
    EXPECT_TRUE(notify.WaitFor("STOPPING=1", absl::Seconds(10)));
    absl::StatusOr<int> code = (*p)->Wait(absl::Seconds(60));
    ASSERT_TRUE(code.ok());
    EXPECT_EQ(*code, 0);
  }
  {
    // A checkpoint that does not open: one error line, never READY=1.
    mneme::testing::NotifySocket notify;
    std::vector<std::string> argv = {
        mneme::testing::RunfilePath("mneme/services/engram/mneme_engram_store"),
        "--checkpoint=/nonexistent/ckpt", "--listen=127.0.0.1:0",
        "--metrics_listen=none"};
    auto p = Subprocess::Start(argv, {{"NOTIFY_SOCKET", notify.env_value()}});
    ASSERT_TRUE(p.ok());
    absl::StatusOr<int> code = (*p)->Wait(absl::Seconds(60));
    ASSERT_TRUE(code.ok());
    EXPECT_EQ(*code, 1);
    EXPECT_FALSE(notify.WaitFor("READY=1", absl::Milliseconds(300)));
    EXPECT_NE((*p)->Stderr().find("/nonexistent/ckpt"), std::string::npos)
        << (*p)->Stderr();
  }
}

TEST(EngramServiceDrain, SigtermDuringLoadCompletesInFlightAndExitsZero) {
  const std::string& dir = Checkpoint(formats::RowFormat::kFp8);
  absl::StatusOr<std::unique_ptr<EngramCheckpoint>> ckpt =
      EngramCheckpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  Daemon d = StartDaemon(dir);
  ASSERT_FALSE(d.address.empty());
  std::atomic<bool> stop = false;
  std::atomic<int64_t> calls = 0;
  LoadResult result;
  std::thread load([&] {
    RunLoad(d.address, 16, (*ckpt)->tables()[0].layer,
            (*ckpt)->hasher().vocabulary().num_tokens(), stop, result, calls);
  });
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (calls.load() < 200 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  result.signalled = true;
  d.process->Signal(SIGTERM);
  absl::StatusOr<int> code = d.process->Wait(absl::Seconds(60));
  stop = true;
  load.join();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  // Every call started before the signal either completed or was refused
  // as draining: nothing in flight was cut off.
  absl::MutexLock lock(&result.mu);
  for (const auto& [c, n] : result.before_signal) {
    EXPECT_TRUE(c == absl::StatusCode::kOk ||
                c == absl::StatusCode::kUnavailable)
        << absl::StatusCodeToString(c) << " x " << n;
  }
  // Later calls are refused: Unavailable while draining or once the server
  // is gone, or Cancelled by gRPC for calls that reach the server while it
  // shuts down after the drain (never admitted).
  for (const auto& [c, n] : result.codes) {
    if (c == absl::StatusCode::kCancelled) continue;
    EXPECT_TRUE(c == absl::StatusCode::kOk ||
                c == absl::StatusCode::kUnavailable)
        << absl::StatusCodeToString(c) << " x " << n;
  }
  EXPECT_GT(result.codes[absl::StatusCode::kOk], 0);
}

}  // namespace
}  // namespace mneme::engram
