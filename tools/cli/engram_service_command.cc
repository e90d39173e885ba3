#include "tools/cli/engram_service_command.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_channel.h"
#include "common/status_macros.h"
#include "engram_store/client/grpc_engram_client.h"
#include "formats/bf16.h"
#include "nlohmann/json.hpp"
#include "tools/cli/args.h"
#include "tools/cli/percentile.h"

namespace mneme::cli {
namespace {

const std::set<std::string> kConnectionFlags = {
    "server",          "timeout-ms",         "tls-ca", "tls-cert", "tls-key",
    "tls-server-name", "cluster-secret-file"};

absl::StatusOr<std::unique_ptr<engram::GrpcEngramClient>> Connect(
    const Args& args) {
  engram::GrpcEngramClientOptions options;
  ASSIGN_OR_RETURN(std::string server, args.Required("server"));
  options.target = server;
  ASSIGN_OR_RETURN(int64_t timeout_ms,
                   args.GetInt("timeout-ms", 10000, 1, int64_t{1} << 31));
  options.timeout = absl::Milliseconds(timeout_ms);
  options.tls.ca_file = args.Get("tls-ca", "");
  options.tls.cert_file = args.Get("tls-cert", "");
  options.tls.key_file = args.Get("tls-key", "");
  options.tls.server_name_override = args.Get("tls-server-name", "");
  // A store started with --cluster_secret_file refuses callers without it.
  ClientChannelOptions peer;
  peer.cluster_secret_file = args.Get("cluster-secret-file", "");
  SetPeerChannelDefaults(peer);
  return engram::GrpcEngramClient::Create(options);
}

std::set<std::string> With(std::set<std::string> a,
                           const std::set<std::string>& b) {
  a.insert(b.begin(), b.end());
  return a;
}

}  // namespace

absl::Status RunEngramLookup(const std::vector<std::string>& argv,
                             std::ostream& out) {
  ASSIGN_OR_RETURN(Args args,
                   Args::Parse(argv,
                               With({"layer", "ids", "tokens", "context",
                                     "columns", "encoding"},
                                    kConnectionFlags),
                               {"stream"}));
  ASSIGN_OR_RETURN(int64_t layer, args.GetInt("layer", -1, 0, 1 << 20));
  if (!args.Has("layer"))
    return absl::InvalidArgumentError("--layer is required");
  if (args.Has("ids") == args.Has("tokens")) {
    return absl::InvalidArgumentError("give exactly one of --ids and --tokens");
  }
  ASSIGN_OR_RETURN(std::string encoding,
                   args.GetChoice("encoding", "bf16", {"bf16", "fp32"}));
  engram::v1::LookupRequest request;
  request.set_layer_id(static_cast<int32_t>(layer));
  request.set_encoding(encoding == "fp32" ? engram::v1::ROW_ENCODING_FP32
                                          : engram::v1::ROW_ENCODING_BF16);
  if (args.Has("ids")) {
    ASSIGN_OR_RETURN(std::vector<int64_t> ids, args.GetIntList("ids"));
    request.mutable_row_ids()->Assign(ids.begin(), ids.end());
  } else {
    ASSIGN_OR_RETURN(std::vector<int64_t> tokens, args.GetIntList("tokens"));
    request.mutable_token_ids()->Assign(tokens.begin(), tokens.end());
    ASSIGN_OR_RETURN(int64_t context,
                     args.GetInt("context", 0, 0, int64_t{1} << 30));
    request.set_context_token_count(static_cast<int32_t>(context));
    if (args.Has("columns")) {
      ASSIGN_OR_RETURN(std::vector<int64_t> columns,
                       args.GetIntList("columns"));
      for (int64_t c : columns) request.add_columns(static_cast<int32_t>(c));
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<engram::GrpcEngramClient> client,
                   Connect(args));
  ASSIGN_OR_RETURN(engram::v1::LookupResponse response,
                   args.Has("stream") ? client->LookupStream(request)
                                      : client->Lookup(request));
  const std::string& rows = response.rows();
  const size_t row_bytes = static_cast<size_t>(response.row_bytes());
  const bool fp32 = response.encoding() == engram::v1::ROW_ENCODING_FP32;
  char buf[32];
  for (int r = 0; r < response.row_ids_size(); ++r) {
    std::string line = absl::StrCat(response.row_ids(r), ":");
    const char* row = rows.data() + r * row_bytes;
    for (int64_t i = 0; i < response.row_dim(); ++i) {
      float v = 0;
      if (fp32) {
        std::memcpy(&v, row + 4 * i, 4);
      } else {
        uint16_t b = 0;
        std::memcpy(&b, row + 2 * i, 2);
        v = formats::Bf16ToFloat(b);
      }
      std::snprintf(buf, sizeof(buf), " %.9g", v);
      line += buf;
    }
    out << line << "\n";
  }
  return absl::OkStatus();
}

absl::Status RunBenchEngramService(const std::vector<std::string>& argv,
                                   std::ostream& out) {
  ASSIGN_OR_RETURN(
      Args args,
      Args::Parse(argv, With({"layer", "streams", "duration-s",
                              "tokens-per-step", "vocab-size", "seed"},
                             kConnectionFlags)));
  ASSIGN_OR_RETURN(int64_t layer, args.GetInt("layer", -1, 0, 1 << 20));
  if (!args.Has("layer"))
    return absl::InvalidArgumentError("--layer is required");
  ASSIGN_OR_RETURN(int64_t streams, args.GetInt("streams", 64, 1, 4096));
  ASSIGN_OR_RETURN(int64_t duration, args.GetInt("duration-s", 10, 1, 86400));
  ASSIGN_OR_RETURN(int64_t per_step,
                   args.GetInt("tokens-per-step", 1, 1, 1 << 20));
  ASSIGN_OR_RETURN(int64_t vocab,
                   args.GetInt("vocab-size", 1000, 1, int64_t{1} << 32));
  ASSIGN_OR_RETURN(int64_t seed, args.GetInt("seed", 1, 0, int64_t{1} << 62));
  ASSIGN_OR_RETURN(std::unique_ptr<engram::GrpcEngramClient> client,
                   Connect(args));
  // Fail fast on a wrong address or layer.
  ASSIGN_OR_RETURN(engram::v1::DescribeResponse describe, client->Describe());

  // Zipf(1.1) over the vocabulary, as natural text is.
  std::vector<double> cdf(vocab);
  double total = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    total += 1.0 / std::pow(static_cast<double>(i + 1), 1.1);
    cdf[i] = total;
  }
  absl::Mutex mu;
  std::vector<double> latencies;
  int64_t rows = 0, bytes = 0, calls = 0, errors = 0;
  absl::Status first_error;
  const absl::Time start = absl::Now();
  const absl::Time end = start + absl::Seconds(duration);
  std::vector<std::thread> threads;
  for (int64_t s = 0; s < streams; ++s) {
    threads.emplace_back([&, s] {
      std::mt19937_64 rng(seed * 1000003 + s);
      std::uniform_real_distribution<double> u(0, total);
      auto next = [&] {
        return static_cast<int64_t>(
            std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin());
      };
      std::vector<int64_t> history = {next(), next(), next()};
      std::vector<double> local;
      int64_t local_rows = 0, local_bytes = 0, local_errors = 0;
      absl::Status local_error;
      while (absl::Now() < end) {
        engram::v1::LookupRequest request;
        request.set_layer_id(static_cast<int32_t>(layer));
        request.mutable_token_ids()->Assign(history.end() - 3, history.end());
        request.set_context_token_count(3);
        for (int64_t t = 0; t < per_step; ++t) {
          history.push_back(next());
          request.add_token_ids(history.back());
        }
        history.erase(history.begin(), history.end() - 3);
        const absl::Time t0 = absl::Now();
        absl::StatusOr<engram::v1::LookupResponse> r = client->Lookup(request);
        local.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
        if (r.ok()) {
          local_rows += r->row_ids_size();
          local_bytes += static_cast<int64_t>(r->rows().size());
        } else {
          ++local_errors;
          if (local_error.ok()) local_error = r.status();
        }
      }
      absl::MutexLock lock(&mu);
      latencies.insert(latencies.end(), local.begin(), local.end());
      calls += static_cast<int64_t>(local.size());
      rows += local_rows;
      bytes += local_bytes;
      errors += local_errors;
      if (first_error.ok()) first_error = local_error;
    });
  }
  for (std::thread& t : threads) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  nlohmann::ordered_json result = {
      {"server", args.Get("server", "")},
      {"layer", layer},
      {"streams", streams},
      {"tokens_per_step", per_step},
      {"seconds", seconds},
      {"calls", calls},
      {"errors", errors},
      {"rows_per_s", static_cast<double>(rows) / seconds},
      {"bytes_per_s", static_cast<double>(bytes) / seconds},
      {"p50_ms", Percentile(latencies, 50) * 1e3},
      {"p99_ms", Percentile(latencies, 99) * 1e3},
      {"max_ms", Percentile(latencies, 100) * 1e3},
  };
  if (!first_error.ok()) result["first_error"] = first_error.ToString();
  out << result.dump() << "\n";
  return absl::OkStatus();
}

}  // namespace mneme::cli
