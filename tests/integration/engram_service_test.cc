// Starts the real mneme_engram_store daemon on 127.0.0.1:0 over synthetic
// checkpoints and checks it through the C++ gRPC client, the Python example
// client and the mneme CLI: rows identical to direct decoding (both formats,
// by ids and by tokens, unary and streamed), specific codes for bad requests
// while the daemon keeps serving, and mutual TLS. Load, memory, readiness and
// draining are in engram_service_load_test.cc.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "engram_store/client/grpc_engram_client.h"
#include "engram_store/engram_checkpoint.h"
#include "formats/row_format.h"
#include "gtest/gtest.h"
#include "tests/integration/engram_service_test_util.h"
#include "tests/testing/daemon.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tls_certs.h"

namespace mneme::engram {
namespace {

using ::mneme::testing::Daemon;
using ::mneme::testing::Subprocess;
using service_testing::Checkpoint;
using service_testing::Client;
using service_testing::Expected;
using service_testing::Join;
using service_testing::RandomIds;
using service_testing::RandomTokens;
using service_testing::ReadFile;
using service_testing::StartDaemon;

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
      if (std::string(stream) == "--stream") args.emplace_back(stream);
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

}  // namespace
}  // namespace mneme::engram
