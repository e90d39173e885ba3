// Tensor parallelism across real processes: an engram store daemon and N
// mneme_worker daemons (Gloo over TCP on 127.0.0.1) run the same steps as
// the single-process reference (LocalModel, TP 1); their logits must agree
// within a stated tolerance for prompts of several lengths, batched and
// chunked, decode steps, hc_mult 1 and 4, FP8 and NVFP4 Engram tables.

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/worker/v1/worker.grpc.pb.h"
#include "services/worker/local_model.h"
#include "tests/testing/command.h"
#include "tests/testing/daemon.h"

namespace mneme {
namespace {

using ::mneme::testing::RunfilePath;
namespace v1 = ::mneme::worker::v1;

// Logits of a TP-N run may differ from TP 1 by summation order only (the
// all-reduces add partial sums in another order): |a - b| <= kTolerance *
// (1 + max |b|) over a row.
constexpr float kTolerance = 1e-4f;

std::string TestDir(const std::string& name) {
  return absl::StrCat(getenv("TEST_TMPDIR"), "/", name);
}

// A tiny model checkpoint of a released layout, made once per (engram
// format, architecture).
std::string Checkpoint(const std::string& format, const std::string& arch) {
  static std::map<std::string, std::string>* made =
      new std::map<std::string, std::string>();
  const std::string key = absl::StrCat(format, "-", arch);
  if (auto it = made->find(key); it != made->end()) return it->second;
  const std::string dir = TestDir("ckpt-" + key);
  std::vector<std::string> argv = {
      "make-checkpoint", "--model", "--out",  dir,
      "--arch",          arch,      "--seed", "11"};
  if (arch == "v4.1-flash") {
    argv.insert(argv.end(), {"--engram-format", format});
  }
  const testing::CommandResult r = testing::RunMneme(argv);
  EXPECT_EQ(r.code, 0) << r.err;
  return (*made)[key] = dir;
}

using ::mneme::testing::Daemon;
using ::mneme::testing::StartDaemon;

struct Cluster {
  Daemon store;
  std::vector<Daemon> workers;
  std::vector<std::unique_ptr<v1::Worker::Stub>> stubs;

  // Sends `request` to every rank at once; every rank's response.
  std::vector<std::pair<grpc::Status, v1::StepResponse>> Step(
      const v1::StepRequest& request) {
    std::vector<std::pair<grpc::Status, v1::StepResponse>> out(stubs.size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < stubs.size(); ++r) {
      threads.emplace_back([&, r] {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(120));
        out[r].first = stubs[r]->Step(&ctx, request, &out[r].second);
      });
    }
    for (std::thread& t : threads) t.join();
    return out;
  }

  v1::GetInfoResponse Info(int rank) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(30));
    v1::GetInfoResponse info;
    const grpc::Status st = stubs[rank]->GetInfo(&ctx, {}, &info);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return info;
  }
};

// Workers of `checkpoint` (and an engram store when it has Engram layers).
std::unique_ptr<Cluster> StartCluster(const std::string& checkpoint, int tp,
                                      bool engram, int dcp = 1,
                                      int interleave = 1) {
  auto c = std::make_unique<Cluster>();
  if (engram) {
    c->store =
        StartDaemon({RunfilePath("mneme/services/engram/mneme_engram_store"),
                     "--checkpoint=" + checkpoint, "--listen=127.0.0.1:0",
                     "--metrics_listen=none", "--io_threads=2",
                     "--worker_threads=2", "--ram_cache_bytes=8388608"});
  }
  std::string group;
  for (int r = 0; r < tp; ++r) {
    std::vector<std::string> argv = {
        RunfilePath("mneme/services/worker/mneme_worker"),
        "--checkpoint=" + checkpoint,
        "--listen=127.0.0.1:0",
        "--metrics_listen=none",
        absl::StrCat("--rank=", r),
        absl::StrCat("--tp_size=", tp),
        "--threads=1",
        "--comm_timeout=60s",
        "--kv_cache_bytes=16777216",
        absl::StrCat("--dcp_size=", dcp),
        absl::StrCat("--dcp_interleave=", interleave)};
    if (engram) argv.push_back("--engram_store=" + c->store.address);
    if (r > 0) argv.push_back("--group=" + group);
    c->workers.push_back(StartDaemon(argv));
    if (r == 0) group = c->workers[0].address;
  }
  for (const Daemon& w : c->workers) {
    c->stubs.push_back(v1::Worker::NewStub(
        grpc::CreateChannel(w.address, grpc::InsecureChannelCredentials())));
  }
  // Ready once every rank answers GetInfo (NOT ready = UNAVAILABLE).
  for (int r = 0; r < tp; ++r) {
    for (int attempt = 0;; ++attempt) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
      v1::GetInfoResponse info;
      const grpc::Status st = c->stubs[r]->GetInfo(&ctx, {}, &info);
      if (st.ok()) break;
      if (attempt > 600) {
        ADD_FAILURE() << "rank " << r
                      << " never became ready: " << st.error_message()
                      << c->workers[r].process->Stderr();
        break;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  // The ranks load without a group; form generation 1 as the coordinator
  // does (every rank at once: each waits for the others).
  if (tp > 1) {
    std::vector<grpc::Status> joined(tp);
    std::vector<std::thread> threads;
    threads.reserve(tp);
    for (int r = 0; r < tp; ++r) {
      threads.emplace_back([&, r] {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(90));
        v1::JoinGroupRequest join;
        join.set_generation(1);
        v1::JoinGroupResponse response;
        joined[r] = c->stubs[r]->JoinGroup(&ctx, join, &response);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < tp; ++r) {
      EXPECT_TRUE(joined[r].ok())
          << "rank " << r << ": " << joined[r].error_message();
      EXPECT_TRUE(c->Info(r).in_group());
    }
  }
  return c;
}

// Prompt tokens above the special ids.
std::vector<int64_t> Prompt(int length, int salt) {
  std::vector<int64_t> p(length);
  for (int i = 0; i < length; ++i) p[i] = 3 + (i * 37 + salt * 101) % 600;
  return p;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(want[i]));
    max_diff = std::max(max_diff, std::fabs(got[i] - want[i]));
  }
  EXPECT_LE(max_diff, kTolerance * (1 + max_ref))
      << what << ": max |diff| " << max_diff << ", max |logit| " << max_ref;
}

// The last logits of `prompt` prefilled whole in one step, as sequence
// `id`, on the single-process model.
void WholePromptLogits(model::Model& model, uint64_t id,
                       const std::vector<int64_t>& prompt,
                       std::vector<float>* logits) {
  model::StepInput whole;
  model::SequenceChunk c;
  c.sequence_id = id;
  c.tokens = prompt;
  whole.chunks.push_back(c);
  absl::StatusOr<model::StepOutput> out = model.Step(whole);
  ASSERT_TRUE(out.ok()) << out.status();
  *logits = std::move(out->logits[0]);
}

// Prefills `prompt` as sequence `id` on the cluster of `tp` ranks, one step
// a chunk, the chunks ending at `ends` (ascending, the last at
// prompt.size()); every rank answers every step, and the last chunk's last
// logits are `want`'s.
void PrefillInChunks(Cluster& cluster, int tp, uint64_t id,
                     const std::vector<int64_t>& prompt,
                     const std::vector<size_t>& ends,
                     const std::vector<float>& want, const std::string& what) {
  size_t begin = 0;
  for (const size_t end : ends) {
    v1::StepRequest chunk;
    v1::SequenceChunk* c = chunk.add_chunks();
    c->set_sequence_id(id);
    c->mutable_token_ids()->Add(prompt.begin() + begin, prompt.begin() + end);
    c->set_start_position(static_cast<int64_t>(begin));
    c->set_output(end == prompt.size() ? v1::OUTPUT_LOGITS_LAST
                                       : v1::OUTPUT_NONE);
    auto got = cluster.Step(chunk);
    for (int r = 0; r < tp; ++r) {
      ASSERT_TRUE(got[r].first.ok())
          << what << ", rank " << r << ": " << got[r].first.error_message();
    }
    if (end == prompt.size()) {
      const auto& l = got[0].second.results(0).logits();
      ExpectClose(std::vector<float>(l.begin(), l.end()), want, what);
    }
    begin = end;
  }
}

// tp, engram format, architecture, dcp, dcp interleave.
using Config = std::tuple<int, std::string, std::string, int, int>;

class WorkerTpTest : public ::testing::TestWithParam<Config> {};

TEST_P(WorkerTpTest, LogitsMatchSingleProcess) {
  const auto [tp, format, arch, dcp, interleave] = GetParam();
  const std::string ckpt = Checkpoint(format, arch);
  worker::LocalModelOptions lo;
  lo.checkpoint_dir = ckpt;
  lo.threads = 1;
  absl::StatusOr<std::unique_ptr<worker::LocalModel>> ref =
      worker::LocalModel::Create(lo);
  ASSERT_TRUE(ref.ok()) << ref.status();
  model::Model& model = (*ref)->model();
  std::unique_ptr<Cluster> cluster =
      StartCluster(ckpt, tp, arch == "v4.1-flash", dcp, interleave);
  ASSERT_EQ(cluster->stubs.size(), static_cast<size_t>(tp));

  // Sequences 7, 1..3 and 6 prefill whole prompts in one batched step, 7
  // and 6 long enough that the decode steps' indexers choose among their
  // entries (index_topk 16: past 64 tokens at ratio 4, 32 at ratio 2), 7
  // first so that the choices (in order of the entries) take the queries
  // out of the step's order; sequence 4 prefills a long prompt in chunks of
  // 9 tokens, long enough that the indexers drop entries and the V4.1
  // candidate blocks leave some out.
  const std::vector<int> lengths = {90, 1, 7, 40, 70};
  const std::vector<uint64_t> ids = {7, 1, 2, 3, 6};
  const std::vector<int64_t> long_prompt = Prompt(150, 9);
  std::map<uint64_t, int64_t> position;
  std::map<uint64_t, int64_t> next_token;
  v1::StepRequest request;
  model::StepInput ref_input;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const uint64_t id = ids[i];
    const std::vector<int64_t> prompt = Prompt(lengths[i], static_cast<int>(i));
    v1::SequenceChunk* c = request.add_chunks();
    c->set_sequence_id(id);
    c->mutable_token_ids()->Add(prompt.begin(), prompt.end());
    c->set_output(v1::OUTPUT_LOGITS_LAST);
    model::SequenceChunk rc;
    rc.sequence_id = id;
    rc.tokens = prompt;
    ref_input.chunks.push_back(rc);
    position[id] = lengths[i];
  }
  // Decode steps after the batched prefill, teacher-forced by the
  // reference's argmax.
  for (int step = 0; step < 4; ++step) {
    absl::StatusOr<model::StepOutput> want = model.Step(ref_input);
    ASSERT_TRUE(want.ok()) << want.status();
    request.set_step_id(step);
    auto got = cluster->Step(request);
    for (int r = 0; r < tp; ++r) {
      ASSERT_TRUE(got[r].first.ok())
          << "rank " << r << ": " << got[r].first.error_message();
      ASSERT_EQ(got[r].second.results_size(), request.chunks_size());
    }
    for (int i = 0; i < request.chunks_size(); ++i) {
      // Rank 0 answers the logits; the others only the chunk (worker.proto
      // StepResponse: they would send the same rows again).
      const auto& l = got[0].second.results(i).logits();
      ExpectClose(std::vector<float>(l.begin(), l.end()), want->logits[i],
                  absl::StrCat("step ", step, " sequence ",
                               request.chunks(i).sequence_id()));
      for (int r = 1; r < tp; ++r) {
        EXPECT_EQ(got[r].second.results(i).sequence_id(),
                  request.chunks(i).sequence_id());
        EXPECT_EQ(got[r].second.results(i).logits_size(), 0) << "rank " << r;
      }
    }
    // Next step: one token per sequence (the reference's argmax).
    v1::StepRequest next;
    model::StepInput next_ref;
    for (int i = 0; i < request.chunks_size(); ++i) {
      const uint64_t id = request.chunks(i).sequence_id();
      const std::vector<float>& lg = want->logits[i];
      const int64_t token = std::max_element(lg.begin(), lg.end()) - lg.begin();
      v1::SequenceChunk* c = next.add_chunks();
      c->set_sequence_id(id);
      c->add_token_ids(token);
      c->set_start_position(position[id]);
      c->set_output(v1::OUTPUT_LOGITS_LAST);
      model::SequenceChunk rc;
      rc.sequence_id = id;
      rc.tokens = {token};
      rc.start_position = position[id];
      next_ref.chunks.push_back(rc);
      position[id] += 1;
    }
    request = next;
    ref_input = next_ref;
  }

  // Chunked prefill on the cluster vs the whole prompt at once on the
  // reference.
  std::vector<float> want_whole;
  ASSERT_NO_FATAL_FAILURE(
      WholePromptLogits(model, 99, long_prompt, &want_whole));
  std::vector<size_t> ends;
  for (size_t end = 9; end < long_prompt.size(); end += 9) ends.push_back(end);
  ends.push_back(long_prompt.size());
  ASSERT_NO_FATAL_FAILURE(PrefillInChunks(*cluster, tp, 4, long_prompt, ends,
                                          want_whole, "chunked prefill"));

  // DCP: a long chunk after a short one, so that the compressors pool the
  // rank's (sparse) entries in several passes, the first reading positions
  // before the chunk from the state.
  if (dcp > 1) {
    const std::vector<int64_t> prompt = Prompt(2400, 11);
    std::vector<float> want_long;
    ASSERT_NO_FATAL_FAILURE(WholePromptLogits(model, 98, prompt, &want_long));
    ASSERT_NO_FATAL_FAILURE(PrefillInChunks(*cluster, tp, 5, prompt,
                                            {100, 2400}, want_long,
                                            "a long chunk under DCP"));
  }

  // A bad plan changes nothing: a wrong start position is refused on every
  // rank, and the group keeps working.
  v1::StepRequest bad;
  v1::SequenceChunk* b = bad.add_chunks();
  b->set_sequence_id(1);
  b->add_token_ids(5);
  b->set_start_position(1000);
  for (auto& [st, resp] : cluster->Step(bad)) {
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("starts at position 1000"),
              std::string::npos)
        << st.error_message();
  }

  // Without DCP every rank holds what the reference holds; with DCP each
  // holds only its share of the compressed entries.
  const int ref_used =
      model.kv_cache().num_blocks() - model.kv_cache().free_blocks();
  for (int r = 0; r < tp; ++r) {
    const v1::GetInfoResponse info = cluster->Info(r);
    const int used = info.kv_blocks_total() - info.kv_blocks_free();
    if (dcp > 1) {
      EXPECT_LT(used, ref_used) << "rank " << r;
    } else {
      EXPECT_EQ(used, ref_used) << "rank " << r;
    }
  }

  // A sampled token: rank 0 answers it with its top log-probabilities, every
  // other rank only the token, the same one (each starts its next chunk with
  // its own).
  v1::StepRequest sample;
  v1::SequenceChunk* sc = sample.add_chunks();
  sc->set_sequence_id(4);
  sc->add_token_ids(7);
  sc->set_start_position(static_cast<int64_t>(long_prompt.size()));
  sc->set_output(v1::OUTPUT_SAMPLE);
  sc->set_top_logprobs(3);
  auto sampled = cluster->Step(sample);
  for (int r = 0; r < tp; ++r) {
    ASSERT_TRUE(sampled[r].first.ok()) << sampled[r].first.error_message();
    ASSERT_EQ(sampled[r].second.results_size(), 1);
    const v1::ChunkResult& res = sampled[r].second.results(0);
    EXPECT_EQ(res.sequence_id(), 4u);
    EXPECT_EQ(res.token_id(), sampled[0].second.results(0).token_id())
        << "rank " << r;
    EXPECT_EQ(res.top_ids_size(), r == 0 ? 3 : 0) << "rank " << r;
  }

  // Releasing every sequence returns every cache block.
  v1::ReleaseRequest release;
  for (uint64_t id : {1, 2, 3, 4, 6, 7}) release.add_sequence_ids(id);
  if (dcp > 1) release.add_sequence_ids(5);
  for (int r = 0; r < tp; ++r) {
    grpc::ClientContext ctx;
    v1::ReleaseResponse resp;
    ASSERT_TRUE(cluster->stubs[r]->Release(&ctx, release, &resp).ok());
    const v1::GetInfoResponse info = cluster->Info(r);
    EXPECT_EQ(info.rank(), r);
    EXPECT_EQ(info.tp_size(), tp);
    EXPECT_EQ(info.sequences(), 0);
    EXPECT_EQ(info.kv_blocks_free(), info.kv_blocks_total());
  }
}

std::string Name(const ::testing::TestParamInfo<Config>& info) {
  const auto& [tp, format, arch, dcp, interleave] = info.param;
  return absl::StrCat(
      "tp", tp, "_", arch == "v4-flash" ? "v4" : "v41", "_", format,
      dcp > 1 ? absl::StrCat("_dcp", dcp, "i", interleave) : "");
}

INSTANTIATE_TEST_SUITE_P(Tp, WorkerTpTest,
                         ::testing::Values(Config{2, "fp8", "v4.1-flash", 1, 1},
                                           Config{4, "nvfp4", "v4.1-flash", 1,
                                                  1},
                                           Config{2, "fp8", "v4-flash", 1, 1},
                                           Config{4, "fp8", "v4-flash", 1, 1}),
                         Name);

// Decode context parallelism: the compressed entries split across the
// ranks (interleave 1 and 3), the partial attentions merged by log-sum-exp.
INSTANTIATE_TEST_SUITE_P(Dcp, WorkerTpTest,
                         ::testing::Values(Config{2, "fp8", "v4.1-flash", 2, 1},
                                           Config{4, "nvfp4", "v4.1-flash", 4,
                                                  3},
                                           Config{2, "fp8", "v4-flash", 2, 3},
                                           Config{4, "fp8", "v4-flash", 4, 1}),
                         Name);

}  // namespace
}  // namespace mneme
