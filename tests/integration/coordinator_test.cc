// The whole cluster on 127.0.0.1: an engram store, tensor-parallel workers
// (Gloo) and the coordinator, driven through the public Serving API and
// checked against the single-process reference (LocalModel): chunked
// prefill with TP 4 + DCP 4, 32 concurrent requests with preemption, abort,
// disconnect, admission limits, invalid requests, and a worker lost and
// restarted.

#include <csignal>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "model/generate.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "proto/serving/v1/serving.grpc.pb.h"
#include "services/worker/local_model.h"
#include "tests/testing/command.h"
#include "tests/testing/daemon.h"

namespace mneme {
namespace {

using ::mneme::testing::RunfilePath;
namespace sv1 = ::mneme::serving::v1;

const std::string& Checkpoint() { return testing::TinyModelCheckpoint(); }

// The reference: greedy (or seeded) generation in this process, TP 1,
// without speculation.
std::vector<int64_t> Reference(const std::vector<int64_t>& prompt, int max_new,
                               bool ignore_eos = false,
                               const std::string& checkpoint = Checkpoint()) {
  static auto* models =
      new std::map<std::string, std::unique_ptr<worker::LocalModel>>();
  std::unique_ptr<worker::LocalModel>& slot = (*models)[checkpoint];
  if (slot == nullptr) {
    worker::LocalModelOptions o;
    o.checkpoint_dir = checkpoint;
    o.threads = 1;
    absl::StatusOr<std::unique_ptr<worker::LocalModel>> m =
        worker::LocalModel::Create(o);
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return {};
    slot = *std::move(m);
  }
  worker::LocalModel* local = slot.get();
  model::GenerateOptions g;
  g.max_new_tokens = max_new;
  g.stop_at_eos = !ignore_eos;
  absl::StatusOr<model::GenerateResult> r =
      model::Generate(local->model(), prompt, g);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->token_ids : std::vector<int64_t>{};
}

std::vector<int64_t> Prompt(int length, int salt) {
  std::vector<int64_t> p(length);
  for (int i = 0; i < length; ++i) p[i] = 3 + (i * 29 + salt * 71) % 600;
  return p;
}

using ::mneme::testing::Daemon;
using ::mneme::testing::Launch;

struct ClusterOptions {
  int tp = 2;
  int dcp = 1;
  std::vector<std::string> coordinator_flags;
  std::string comm_timeout = "60s";
};

class Cluster {
 public:
  // `checkpoint`: Checkpoint() when empty; `worker_flags`: more flags for
  // every worker.
  explicit Cluster(const ClusterOptions& o, const std::string& checkpoint = "",
                   std::vector<std::string> worker_flags = {})
      : options_(o),
        checkpoint_(checkpoint.empty() ? Checkpoint() : checkpoint),
        worker_flags_(std::move(worker_flags)) {
    // A model without Engram layers (V4) runs without a store.
    std::ifstream config(checkpoint_ + "/config.json");
    const std::string text((std::istreambuf_iterator<char>(config)),
                           std::istreambuf_iterator<char>());
    if (absl::StrContains(text, "engram_layer_ids")) {
      store_.argv = {RunfilePath("mneme/services/engram/mneme_engram_store"),
                     "--checkpoint=" + checkpoint_,
                     "--listen=127.0.0.1:0",
                     "--metrics_listen=127.0.0.1:0",
                     "--io_threads=2",
                     "--worker_threads=2"};
      Launch(store_);
      store_metrics_ = testing::StdoutValue(*store_.process, "metrics on ");
    }
    workers_.resize(o.tp);
    for (int r = 0; r < o.tp; ++r) {
      StartWorker(r, "127.0.0.1:0");
    }
    std::string list;
    for (const Daemon& w : workers_) {
      list += (list.empty() ? "" : ",") + w.address;
    }
    coordinator_.argv = {RunfilePath("mneme/services/coordinator/"
                                     "mneme_coordinator"),
                         "--workers=" + list, "--listen=127.0.0.1:0",
                         "--metrics_listen=none", "--step_timeout=60s"};
    coordinator_.argv.insert(coordinator_.argv.end(),
                             o.coordinator_flags.begin(),
                             o.coordinator_flags.end());
    Launch(coordinator_);
    channel_ = grpc::CreateChannel(coordinator_.address,
                                   grpc::InsecureChannelCredentials());
    stub_ = sv1::Serving::NewStub(channel_);
    EXPECT_TRUE(WaitServing(true, absl::Seconds(120)))
        << coordinator_.process->Stderr();
  }

  void StartWorker(int rank, const std::string& listen) {
    Daemon& w = workers_[rank];
    w.argv = {RunfilePath("mneme/services/worker/mneme_worker"),
              "--checkpoint=" + checkpoint_,
              "--listen=" + listen,
              "--metrics_listen=none",
              absl::StrCat("--rank=", rank),
              absl::StrCat("--tp_size=", options_.tp),
              absl::StrCat("--dcp_size=", options_.dcp),
              "--threads=1",
              "--comm_timeout=" + options_.comm_timeout,
              "--kv_cache_bytes=33554432"};
    if (!store_.address.empty()) {
      w.argv.push_back("--engram_store=" + store_.address);
    }
    w.argv.insert(w.argv.end(), worker_flags_.begin(), worker_flags_.end());
    if (rank > 0) w.argv.push_back("--group=" + workers_[0].address);
    Launch(w);
  }

  bool Serving() {
    auto health = grpc::health::v1::Health::NewStub(channel_);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    const grpc::Status st = health->Check(&ctx, req, &resp);
    return st.ok() &&
           resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  }

  bool WaitServing(bool want, absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      if (Serving() == want) return true;
      absl::SleepFor(absl::Milliseconds(100));
    }
    return false;
  }

  sv1::GetLoadsResponse Loads() {
    grpc::ClientContext ctx;
    sv1::GetLoadsResponse resp;
    EXPECT_TRUE(stub_->GetLoads(&ctx, {}, &resp).ok());
    return resp;
  }

  // Waits until nothing runs, waits or holds KV.
  bool WaitIdle(absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      const sv1::GetLoadsResponse l = Loads();
      if (l.running_requests() == 0 && l.waiting_requests() == 0 &&
          l.kv_cache_usage() == 0) {
        return true;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }

  // The engram store's count of Prefetch RPCs answered OK.
  double StorePrefetches() {
    const size_t colon = store_metrics_.rfind(':');
    httplib::Client http(store_metrics_.substr(0, colon),
                         std::stoi(store_metrics_.substr(colon + 1)));
    httplib::Result r = http.Get("/metrics");
    if (!r || r->status != 200) return -1;
    const std::string key =
        "mneme_engram_rpcs_total{method=\"Prefetch\",code=\"OK\"} ";
    const size_t at = r->body.find(key);
    if (at == std::string::npos) return 0;
    return std::stod(r->body.substr(at + key.size()));
  }

  sv1::Serving::Stub& stub() { return *stub_; }
  std::vector<Daemon>& workers() { return workers_; }

 private:
  ClusterOptions options_;
  std::string checkpoint_;
  std::vector<std::string> worker_flags_;
  Daemon store_;
  std::string store_metrics_;
  std::vector<Daemon> workers_;
  Daemon coordinator_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<sv1::Serving::Stub> stub_;
};

struct Outcome {
  grpc::Status status;
  std::vector<int64_t> tokens;
  sv1::FinishReason reason = sv1::FINISH_REASON_UNSPECIFIED;
  int prompt_tokens = 0;
  int completion_tokens = 0;
};

sv1::GenerateRequest Request(const std::vector<int64_t>& prompt, int max_new) {
  sv1::GenerateRequest r;
  r.mutable_token_ids()->Add(prompt.begin(), prompt.end());
  r.set_max_new_tokens(max_new);
  return r;
}

Outcome Generate(sv1::Serving::Stub& stub, const sv1::GenerateRequest& req) {
  Outcome o;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(300)));
  auto reader = stub.Generate(&ctx, req);
  sv1::GenerateResponse m;
  while (reader->Read(&m)) {
    o.tokens.insert(o.tokens.end(), m.token_ids().begin(), m.token_ids().end());
    if (m.finish_reason() != sv1::FINISH_REASON_UNSPECIFIED) {
      o.reason = m.finish_reason();
      o.prompt_tokens = m.prompt_tokens();
      o.completion_tokens = m.completion_tokens();
    }
  }
  o.status = reader->Finish();
  return o;
}

TEST(CoordinatorTest, Tp4Dcp4ChunkedPrefillMatchesReference) {
  Cluster c(
      {.tp = 4, .dcp = 4, .coordinator_flags = {"--max_num_batched_tokens=7"}});
  for (int length : {30, 45}) {
    const std::vector<int64_t> prompt = Prompt(length, length);
    const Outcome o = Generate(c.stub(), Request(prompt, 8));
    ASSERT_TRUE(o.status.ok()) << o.status.error_message();
    EXPECT_EQ(o.tokens, Reference(prompt, 8)) << "prompt of " << length;
    EXPECT_EQ(o.prompt_tokens, length);
    EXPECT_EQ(o.completion_tokens, static_cast<int>(o.tokens.size()));
  }
  // The next prefill chunk's rows were staged while the current one ran.
  EXPECT_GT(c.StorePrefetches(), 0);
  EXPECT_TRUE(c.WaitIdle(absl::Seconds(10)));
}

TEST(CoordinatorTest, ConcurrentRequestsWithPreemptionMatchSequentialRuns) {
  // A KV budget that holds only a few of the 32 sequences at once (about
  // 220 tokens of the tiny V4.1-Flash model, 2 KiB of entries per token).
  Cluster c({.tp = 2,
             .coordinator_flags = {"--max_num_batched_tokens=64",
                                   "--kv_cache_bytes=460000"}});
  constexpr int kRequests = 32;
  std::vector<std::vector<int64_t>> prompts;
  std::vector<int> max_new;
  // Short prompts are admitted together; their decodes then outgrow the
  // pool.
  for (int i = 0; i < kRequests; ++i) {
    prompts.push_back(Prompt(1 + (i * 7) % 12, i));
    max_new.push_back(20 + i % 9);
  }
  std::vector<Outcome> outcomes(kRequests);
  std::vector<std::thread> threads;
  threads.reserve(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      sv1::GenerateRequest req = Request(prompts[i], max_new[i]);
      req.set_ignore_eos(true);
      outcomes[i] = Generate(c.stub(), req);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(outcomes[i].status.ok())
        << i << ": " << outcomes[i].status.error_message();
    EXPECT_EQ(outcomes[i].reason, sv1::FINISH_REASON_LENGTH);
    EXPECT_EQ(outcomes[i].tokens,
              Reference(prompts[i], max_new[i], /*ignore_eos=*/true))
        << "request " << i;
  }
  EXPECT_GT(c.Loads().preemptions(), 0);
  EXPECT_TRUE(c.WaitIdle(absl::Seconds(10)));
}

// DSpark speculative decoding through the whole serving path: greedy output
// equals plain greedy decoding (the single-process reference without
// drafts), with chunked prefill, at TP 1, TP 2 + DCP 2 and TP 4 + DCP 4, on
// the model whose drafter mostly agrees with it and on the random one
// (drafts mostly rejected, so the rollback runs every step), and on
// V4-Flash-0731 at TP 2 + DCP 2.
TEST(CoordinatorTest, SpeculativeDecodingMatchesGreedyAtEveryParallelism) {
  struct Case {
    int tp, dcp;
    const std::string* checkpoint;
  };
  for (const Case& k : {Case{1, 1, &testing::TinyAlignedCheckpoint()},
                        Case{2, 2, &testing::TinyAlignedCheckpoint()},
                        Case{4, 4, &testing::TinyAlignedCheckpoint()},
                        Case{2, 2, &Checkpoint()},
                        Case{2, 2, &testing::Tiny0731Checkpoint()}}) {
    SCOPED_TRACE(absl::StrCat("tp ", k.tp, " dcp ", k.dcp, " ", *k.checkpoint));
    Cluster c({.tp = k.tp,
               .dcp = k.dcp,
               .coordinator_flags = {"--max_num_batched_tokens=7",
                                     "--num_speculative_tokens=5"},
               .comm_timeout = "60s"},
              *k.checkpoint, {"--num_speculative_tokens=5"});
    for (int length : {9, 30}) {
      const std::vector<int64_t> prompt = Prompt(length, length);
      sv1::GenerateRequest req = Request(prompt, 24);
      req.set_ignore_eos(true);
      const Outcome o = Generate(c.stub(), req);
      ASSERT_TRUE(o.status.ok()) << o.status.error_message();
      EXPECT_EQ(o.tokens, Reference(prompt, 24, true, *k.checkpoint))
          << "prompt of " << length;
      EXPECT_EQ(o.completion_tokens, 24);
    }
    EXPECT_TRUE(c.WaitIdle(absl::Seconds(10)));
  }
}

// The community checkpoint variants (EXL3 experts; a GridBook artifact with
// W4A4 routed experts, FP8 codebook shared experts and FP8 passthrough) at
// TP 2 with chunked prefill: each equals `mneme run` on one process.
TEST(CoordinatorTest, CommunityCheckpointVariantsAtTp2) {
  for (const char* format : {"exl3", "gridbook"}) {
    const std::string dir =
        absl::StrCat(std::getenv("TEST_TMPDIR"), "/variant-", format);
    const testing::CommandResult made = testing::RunMneme(
        {"make-checkpoint", "--model", "--arch", "v4-flash", "--seed", "7",
         "--experts-format", format, "--out", dir});
    ASSERT_EQ(made.code, 0) << made.err;
    SCOPED_TRACE(format);
    Cluster c({.tp = 2,
               .coordinator_flags = {"--max_num_batched_tokens=7"},
               .comm_timeout = "60s"},
              dir);
    for (int length : {5, 20}) {
      const std::vector<int64_t> prompt = Prompt(length, length);
      sv1::GenerateRequest req = Request(prompt, 8);
      req.set_ignore_eos(true);
      const Outcome o = Generate(c.stub(), req);
      ASSERT_TRUE(o.status.ok()) << o.status.error_message();
      EXPECT_EQ(o.tokens, Reference(prompt, 8, true, dir))
          << "prompt of " << length;
    }
    EXPECT_TRUE(c.WaitIdle(absl::Seconds(10)));
  }
}

// Speculation with preemption: a KV budget that holds a few of the
// sequences at once, so running requests are preempted and recomputed
// (the workers' drafter history is rebuilt with them); each equals its
// plain greedy run, and a request that opts out still matches.
TEST(CoordinatorTest, SpeculativeDecodingWithPreemptionMatchesGreedy) {
  const std::string& ckpt = testing::TinyAlignedCheckpoint();
  Cluster c({.tp = 2,
             .dcp = 2,
             .coordinator_flags = {"--max_num_batched_tokens=64",
                                   "--kv_cache_bytes=460000",
                                   "--num_speculative_tokens=4"},
             .comm_timeout = "60s"},
            ckpt, {"--num_speculative_tokens=4"});
  constexpr int kRequests = 16;
  std::vector<Outcome> outcomes(kRequests);
  std::vector<std::thread> threads;
  threads.reserve(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      sv1::GenerateRequest req = Request(Prompt(1 + (i * 7) % 12, i), 40);
      req.set_ignore_eos(true);
      if (i % 5 == 0) req.set_disable_speculative_decoding(true);
      outcomes[i] = Generate(c.stub(), req);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(outcomes[i].status.ok())
        << i << ": " << outcomes[i].status.error_message();
    EXPECT_EQ(outcomes[i].tokens,
              Reference(Prompt(1 + (i * 7) % 12, i), 40, true, ckpt))
        << "request " << i;
  }
  EXPECT_GT(c.Loads().preemptions(), 0);
  EXPECT_TRUE(c.WaitIdle(absl::Seconds(10)));
}

TEST(CoordinatorTest, InvalidRequestsAbortDisconnectAndAdmission) {
  Cluster c(
      {.tp = 2,
       .coordinator_flags = {"--max_context_tokens=128", "--max_num_seqs=1",
                             "--max_queued_requests=2"}});
  // Invalid requests: INVALID_ARGUMENT, nothing else changes.
  std::vector<sv1::GenerateRequest> bad(4);
  bad[0] = Request({}, 4);
  bad[1] = Request(Prompt(5, 1), -1);
  bad[2] = Request(Prompt(5, 1), 4);
  bad[2].add_stop_token_ids(1 << 30);
  bad[3] = Request(Prompt(200, 1), 4);
  for (const sv1::GenerateRequest& r : bad) {
    const Outcome o = Generate(c.stub(), r);
    EXPECT_EQ(o.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << o.status.error_message();
    EXPECT_TRUE(o.tokens.empty());
  }
  EXPECT_TRUE(c.WaitIdle(absl::Seconds(1)));

  // Abort by id: the stream ends with finish reason ABORT.
  {
    sv1::GenerateRequest req = Request(Prompt(10, 2), 100);
    req.set_ignore_eos(true);
    req.set_request_id("to-abort");
    grpc::ClientContext ctx;
    auto reader = c.stub().Generate(&ctx, req);
    sv1::GenerateResponse m;
    int tokens = 0;
    while (tokens < 2 && reader->Read(&m)) tokens += m.token_ids_size();
    grpc::ClientContext actx;
    sv1::AbortRequest abort;
    abort.set_request_id("to-abort");
    sv1::AbortResponse aresp;
    ASSERT_TRUE(c.stub().Abort(&actx, abort, &aresp).ok());
    sv1::FinishReason reason = sv1::FINISH_REASON_UNSPECIFIED;
    while (reader->Read(&m)) {
      if (m.finish_reason() != sv1::FINISH_REASON_UNSPECIFIED) {
        reason = m.finish_reason();
      }
    }
    EXPECT_TRUE(reader->Finish().ok());
    EXPECT_EQ(reason, sv1::FINISH_REASON_ABORT);
    EXPECT_TRUE(c.WaitIdle(absl::Seconds(10)));
    grpc::ClientContext again;
    EXPECT_EQ(c.stub().Abort(&again, abort, &aresp).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }

  // A client that goes away: its request is aborted and its blocks freed.
  {
    sv1::GenerateRequest req = Request(Prompt(10, 3), 100);
    req.set_ignore_eos(true);
    grpc::ClientContext ctx;
    auto reader = c.stub().Generate(&ctx, req);
    sv1::GenerateResponse m;
    int tokens = 0;
    while (tokens < 2 && reader->Read(&m)) tokens += m.token_ids_size();
    EXPECT_GT(c.Loads().kv_cache_usage(), 0);
    ctx.TryCancel();
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
    EXPECT_TRUE(c.WaitIdle(absl::Seconds(10)));
  }

  // Admission: one running (max_num_seqs 1), two waiting (the limit), the
  // next is RESOURCE_EXHAUSTED.
  {
    std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
    std::vector<std::unique_ptr<grpc::ClientReader<sv1::GenerateResponse>>>
        readers;
    for (int i = 0; i < 3; ++i) {
      sv1::GenerateRequest req = Request(Prompt(4, 10 + i), 100);
      req.set_ignore_eos(true);
      ctxs.push_back(std::make_unique<grpc::ClientContext>());
      readers.push_back(c.stub().Generate(ctxs.back().get(), req));
      sv1::GenerateResponse m;
      ASSERT_TRUE(readers.back()->Read(&m));  // The id: admitted.
      // The first one is running once it streams a token.
      while (i == 0 && m.token_ids_size() == 0) {
        ASSERT_TRUE(readers.back()->Read(&m));
      }
    }
    const Outcome o = Generate(c.stub(), Request(Prompt(4, 20), 4));
    EXPECT_EQ(o.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << o.status.error_message();
    for (auto& ctx : ctxs) ctx->TryCancel();
    for (auto& r : readers) r->Finish();
    EXPECT_TRUE(c.WaitIdle(absl::Seconds(10)));
  }
}

// A worker killed mid-generation: the coordinator stays up, NOT_SERVING, and
// refuses new work; the surviving worker keeps running (and its weights);
// the lost worker comes back alone on its port, the coordinator re-forms the
// group, and the request that was running is recomputed: its stream goes on
// to the end with the reference tokens.
TEST(CoordinatorTest, WorkerLostThenBackAlone) {
  ClusterOptions options;
  options.tp = 2;
  options.comm_timeout = "5s";
  Cluster c(options);
  const std::vector<int64_t> prompt = Prompt(10, 4);
  constexpr int kNew = 300;  // Still running when the worker dies.
  sv1::GenerateRequest req = Request(prompt, kNew);
  req.set_ignore_eos(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
  auto reader = c.stub().Generate(&ctx, req);
  sv1::GenerateResponse m;
  std::vector<int64_t> tokens;
  while (tokens.size() < 2 && reader->Read(&m)) {
    tokens.insert(tokens.end(), m.token_ids().begin(), m.token_ids().end());
  }
  const int survivor = c.workers()[0].process->pid();
  c.workers()[1].process->Signal(SIGKILL);
  c.workers()[1].process->Wait(absl::Seconds(10)).IgnoreError();
  EXPECT_TRUE(c.WaitServing(false, absl::Seconds(30)));
  // The coordinator is up (answers) and refuses new work while not ready.
  const Outcome refused = Generate(c.stub(), Request(Prompt(3, 5), 2));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_FALSE(c.workers()[0].process->Wait(absl::Seconds(1)).ok())
      << "the surviving worker exited: " << c.workers()[0].process->Stderr();

  c.StartWorker(1, c.workers()[1].address);
  while (reader->Read(&m)) {
    tokens.insert(tokens.end(), m.token_ids().begin(), m.token_ids().end());
  }
  const grpc::Status st = reader->Finish();
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(tokens, Reference(prompt, kNew, /*ignore_eos=*/true));
  EXPECT_TRUE(c.WaitServing(true, absl::Seconds(60)));
  EXPECT_EQ(c.workers()[0].process->pid(), survivor);
  const std::vector<int64_t> other = Prompt(12, 6);
  const Outcome o = Generate(c.stub(), Request(other, 6));
  ASSERT_TRUE(o.status.ok()) << o.status.error_message();
  EXPECT_EQ(o.tokens, Reference(other, 6));
}

}  // namespace
}  // namespace mneme
