#include "services/worker/worker_service.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "model/generate.h"
#include "model/spec/verify.h"

namespace mneme::worker {
namespace {

const grpc::Status kDraining(grpc::StatusCode::UNAVAILABLE,
                             "the worker is shutting down");

gpu::SamplingParams FromProto(const v1::SamplingParams& p) {
  gpu::SamplingParams s;
  s.temperature = p.temperature();
  s.top_p = p.top_p() == 0 ? 1.0f : p.top_p();
  s.top_k = p.top_k();
  s.min_p = p.min_p();
  s.seed = p.seed();
  return s;
}

absl::Status CheckSampling(const v1::SamplingParams& p, int index) {
  if (!(p.temperature() >= 0 && p.temperature() <= 1e4) ||
      !(p.top_p() >= 0 && p.top_p() <= 1) || p.top_k() < 0 ||
      !(p.min_p() >= 0 && p.min_p() <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", index,
        ": sampling needs temperature in [0, 1e4], top_p and min_p in [0, "
        "1], top_k >= 0"));
  }
  return absl::OkStatus();
}

absl::Status CheckLogprobs(const v1::SequenceChunk& c, int index,
                           int64_t vocab) {
  if (c.top_logprobs() < 0 || c.top_logprobs() > model::kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", index, ": top_logprobs=", c.top_logprobs(),
                     " must be in [0, ", model::kMaxTopLogprobs, "]"));
  }
  if (c.has_next_token_id() &&
      (c.next_token_id() < -1 || c.next_token_id() >= vocab)) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", index, ": next_token_id=", c.next_token_id(),
                     " must be -1 or in the vocabulary [0, ", vocab, ")"));
  }
  return absl::OkStatus();
}

// Fills result.positions from the chunk's logits [n, vocab]: position p's
// target is the token after it.
absl::Status AddPositionLogprobs(const v1::SequenceChunk& c,
                                 absl::Span<const float> rows, int64_t vocab,
                                 v1::ChunkResult& result) {
  const int n = c.token_ids_size();
  for (int p = 0; p < n; ++p) {
    const int64_t target = p + 1 < n               ? c.token_ids(p + 1)
                           : c.has_next_token_id() ? c.next_token_id()
                                                   : -1;
    ASSIGN_OR_RETURN(
        model::PositionLogprobs lp,
        model::RowLogprobs(
            rows.subspan(static_cast<size_t>(p) * static_cast<size_t>(vocab),
                         static_cast<size_t>(vocab)),
            target, c.top_logprobs()));
    v1::PositionLogprobs* out = result.add_positions();
    out->set_target_logprob(lp.target_logprob);
    out->mutable_top_ids()->Add(lp.top_ids.begin(), lp.top_ids.end());
    out->mutable_top_logprobs()->Add(lp.top_logprobs.begin(),
                                     lp.top_logprobs.end());
  }
  return absl::OkStatus();
}

// The answer for a chunk whose token the step drew (SequenceChunk::sample):
// the token and its log-probability and, on the full answer, the top
// log-probabilities of its last row and the prompt's (both need the rows
// on the host).
absl::Status AnswerDrawnToken(const v1::SequenceChunk& c,
                              const model::SequenceChunk& chunk,
                              const model::SampledToken& token,
                              absl::Span<const float> rows, int64_t vocab,
                              bool full, v1::ChunkResult& result) {
  result.set_token_id(token.id);
  result.set_logprob(token.logprob);
  if (!full) return absl::OkStatus();
  const bool top = c.top_logprobs() > 0;
  if ((top || c.prompt_logprobs()) &&
      rows.size() < static_cast<size_t>(vocab)) {
    return absl::InternalError(absl::StrCat("sequence ", chunk.sequence_id,
                                            ": the model returned ",
                                            rows.size(), " logits"));
  }
  if (top) {
    ASSIGN_OR_RETURN(model::PositionLogprobs lp,
                     model::RowLogprobs(rows.subspan(rows.size() - vocab),
                                        token.id, c.top_logprobs()));
    result.set_logprob(lp.target_logprob);
    result.mutable_top_ids()->Add(lp.top_ids.begin(), lp.top_ids.end());
    result.mutable_top_logprobs()->Add(lp.top_logprobs.begin(),
                                       lp.top_logprobs.end());
  }
  if (c.prompt_logprobs()) {
    RETURN_IF_ERROR(AddPositionLogprobs(c, rows, vocab, result));
  }
  return absl::OkStatus();
}

// The gRPC status of a step's outcome: a step that did not run while the
// group stays intact is marked (worker.proto, kStepNotRunDetails).
grpc::Status ReplyStatus(const absl::Status& st) {
  grpc::Status reply = ToGrpcStatus(st);
  if (model::IsStepNotRun(st)) {
    reply = grpc::Status(reply.error_code(), reply.error_message(),
                         std::string(kStepNotRunDetails));
  }
  return reply;
}

}  // namespace

// Counters updated by the step thread; gauges read the atomics (never the
// model, which only the step thread touches).
struct WorkerService::Metrics {
  Counter* steps = nullptr;
  Counter* failed_steps = nullptr;
  Counter* tokens = nullptr;
  Histogram* step_seconds = nullptr;
  Counter* comm_seconds = nullptr;
  Counter* engram_seconds = nullptr;
  std::atomic<int64_t> kv_blocks_used{0};
  std::atomic<int64_t> kv_blocks_total{0};
  std::atomic<int64_t> sequences{0};
  absl::Duration last_engram;
};

WorkerService::WorkerService(const WorkerServiceOptions& options,
                             InflightGate* gate)
    : options_(options), gate_(gate) {}

absl::Status WorkerService::RegisterMetrics() {
  MetricsRegistry* r = options_.metrics;
  if (r == nullptr) return absl::OkStatus();
  auto m = std::make_unique<Metrics>();
  auto counter = [r](const char* name,
                     const char* help) -> absl::StatusOr<Counter*> {
    ASSIGN_OR_RETURN(
        CounterFamily * f,
        r->AddCounter({.name = name, .help = help, .label_names = {}}));
    return f->Get();
  };
  ASSIGN_OR_RETURN(CounterFamily * outcomes,
                   r->AddCounter({.name = "mneme_worker_steps_total",
                                  .help = "Steps run, by outcome.",
                                  .label_names = {"outcome"}}));
  absl::StatusOr<Counter*> steps = outcomes->Get({"ok"});
  absl::StatusOr<Counter*> failed = outcomes->Get({"error"});
  absl::StatusOr<Counter*> tokens =
      counter("mneme_worker_tokens_total", "Tokens run through the model.");
  absl::StatusOr<Counter*> comm =
      counter("mneme_worker_comm_seconds_total", "Time in collectives.");
  absl::StatusOr<Counter*> engram =
      counter("mneme_worker_engram_seconds_total", "Time getting Engram rows.");
  absl::StatusOr<HistogramFamily*> step =
      r->AddHistogram({.name = "mneme_worker_step_seconds",
                       .help = "Wall time of a step on this rank.",
                       .label_names = {}},
                      std::vector<double>{0.001, 0.005, 0.01, 0.02, 0.05, 0.1,
                                          0.2, 0.5, 1, 2, 5, 10});
  for (const absl::Status& st :
       {steps.status(), failed.status(), tokens.status(), comm.status(),
        engram.status(), step.status()}) {
    if (!st.ok()) return st;
  }
  m->steps = *steps;
  m->failed_steps = *failed;
  m->tokens = *tokens;
  m->comm_seconds = *comm;
  m->engram_seconds = *engram;
  ASSIGN_OR_RETURN(m->step_seconds, (*step)->Get());
  Metrics* raw = m.get();
  for (auto [name, help, value] :
       std::vector<std::tuple<const char*, const char*, std::atomic<int64_t>*>>{
           {"mneme_worker_kv_blocks_used", "KV cache blocks in use.",
            &raw->kv_blocks_used},
           {"mneme_worker_kv_blocks_total", "KV cache blocks in the pool.",
            &raw->kv_blocks_total},
           {"mneme_worker_sequences", "Sequences with state on this rank.",
            &raw->sequences},
       }) {
    // A named copy: clang before 16 cannot capture a structured binding in a
    // lambda (C++20 allows it).
    std::atomic<int64_t>* const gauge = value;
    RETURN_IF_ERROR(r->AddCallbackGauge(
        {.name = name, .help = help, .label_names = {}},
        [gauge] { return static_cast<double>(gauge->load()); }));
  }
  metrics_ = std::move(m);
  return absl::OkStatus();
}

void WorkerService::RecordStep(const model::Model& model, absl::Duration step,
                               absl::Duration comm, int64_t tokens, bool ok) {
  if (metrics_ == nullptr) return;
  Metrics& m = *metrics_;
  if (ok) {
    m.steps->Increment();
    m.tokens->Increment(static_cast<double>(tokens));
    m.step_seconds->Observe(absl::ToDoubleSeconds(step));
  } else {
    m.failed_steps->Increment();
  }
  m.comm_seconds->Increment(absl::ToDoubleSeconds(comm));
  const absl::Duration engram = model.stats().engram_time;
  m.engram_seconds->Increment(absl::ToDoubleSeconds(engram - m.last_engram));
  m.last_engram = engram;
  const model::KvCache& kv = model.kv_cache();
  m.kv_blocks_total.store(kv.num_blocks());
  m.kv_blocks_used.store(kv.num_blocks() - kv.free_blocks());
  m.sequences.store(model.num_sequences());
}

absl::StatusOr<std::unique_ptr<WorkerService>> WorkerService::Create(
    const WorkerServiceOptions& options, InflightGate* gate) {
  if (gate == nullptr) return absl::InvalidArgumentError("gate is required");
  if (options.max_queued_steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_queued_steps=", options.max_queued_steps, " must be >= 1"));
  }
  if (options.max_response_logits < 1) {
    return absl::InvalidArgumentError("max_response_logits must be >= 1");
  }
  std::unique_ptr<WorkerService> service(new WorkerService(options, gate));
  ASSIGN_OR_RETURN(service->pool_,
                   mneme::WorkPool::Create(1, options.max_queued_steps));
  RETURN_IF_ERROR(service->RegisterMetrics());
  return service;
}

WorkerService::~WorkerService() { pool_.reset(); }

void WorkerService::Attach(model::Model* model, gpu::Backend* backend,
                           gpu::GroupMembership* group,
                           model::DsparkDrafter* drafter) {
  absl::MutexLock lock(&mu_);
  model_ = model;
  backend_ = backend;
  group_ = group;
  drafter_ = drafter;
}

absl::Status WorkerService::broken() const {
  absl::ReaderMutexLock lock(&mu_);
  return broken_;
}

bool WorkerService::InGroup() const {
  return broken_.ok() && (group_ == nullptr || group_->in_group());
}

absl::Status WorkerService::Ready(bool in_group) const {
  if (model_ == nullptr) {
    return absl::UnavailableError(
        "the worker is not ready (loading its shard)");
  }
  if (!in_group) return absl::OkStatus();
  if (!broken_.ok()) {
    return absl::UnavailableError(
        absl::StrCat("the worker's group is broken (", broken_.message(),
                     "); waiting for the coordinator to re-form it"));
  }
  if (group_ != nullptr && !group_->in_group()) {
    return absl::UnavailableError(
        absl::StrCat("the worker is in no tensor-parallel group (",
                     group_->error().message(), ")"));
  }
  return absl::OkStatus();
}

template <typename Task>
grpc::ServerUnaryReactor* WorkerService::Schedule(
    grpc::CallbackServerContext* context, bool in_group, Task task) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status st = gate_->Authenticate(*context); !st.ok()) {
    reactor->Finish(ToGrpcStatus(st));
    return reactor;
  }
  std::optional<InflightGate::Pass> pass = gate_->Enter();
  if (!pass.has_value()) {
    reactor->Finish(kDraining);
    return reactor;
  }
  const bool queued =
      pool_->TrySchedule([this, reactor, task = std::move(task),
                          pass = std::move(*pass), in_group]() mutable {
        absl::Status st;
        {
          absl::ReaderMutexLock lock(&mu_);
          st = Ready(in_group);
        }
        if (st.ok()) st = task();
        reactor->Finish(ReplyStatus(st));
      });
  if (!queued) {
    reactor->Finish(ToGrpcStatus(absl::ResourceExhaustedError(
        "the worker's step queue is full; retry later")));
  }
  return reactor;
}

grpc::ServerUnaryReactor* WorkerService::Step(
    grpc::CallbackServerContext* context, const v1::StepRequest* request,
    v1::StepResponse* response) {
  return Schedule(context, /*in_group=*/true, [this, request, response] {
    return StepTask(*request, *response);
  });
}

absl::Status WorkerService::StepTask(const v1::StepRequest& request,
                                     v1::StepResponse& response) {
  // Refused alike on every rank before anything runs: the group is intact.
  RETURN_IF_ERROR(ClaimSequences(request));
  absl::Status st = RunStep(request, response);
  // Validation, cache reservation and Engram lookups (agreed on by every
  // rank) fail alike on every rank before any collective of the layers;
  // any other failure leaves the group out of step.
  if (!st.ok() && st.code() != absl::StatusCode::kInvalidArgument &&
      st.code() != absl::StatusCode::kResourceExhausted &&
      !model::IsStepNotRun(st)) {
    {
      absl::MutexLock lock(&mu_);
      broken_ = st;
      // Close this rank's connections: peers waiting on it in a
      // collective fail now instead of at their timeout.
      if (group_ != nullptr) group_->Leave(st);
    }
    if (options_.on_broken) options_.on_broken(st);
  }
  return st;
}

// One StepStream: reads steps in order and queues each on the step thread
// (so the next step waits there while one runs), at most kMaxStreamedSteps
// at once; writes the answers in the order the steps were read (a step
// refused before it was queued is answered in its place, not ahead of the
// steps before it). Finishes once the client closed its side (or the call
// broke) and every queued step was answered, so no step task outlives the
// reactor.
class WorkerService::StepStreamReactor final
    : public grpc::ServerBidiReactor<v1::StepRequest, v1::StepStreamResponse> {
 public:
  StepStreamReactor(WorkerService* service,
                    grpc::CallbackServerContext* context)
      : service_(service) {
    if (absl::Status st = service_->gate_->Authenticate(*context); !st.ok()) {
      finished_ = true;
      Finish(ToGrpcStatus(st));
      return;
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      bool finish;
      {
        absl::MutexLock lock(&mu_);
        reading_done_ = true;
        finish = ShouldFinishLocked();
      }
      if (finish) Finish(grpc::Status::OK);
      return;
    }
    auto request = std::make_unique<v1::StepRequest>(std::move(request_));
    request_.Clear();
    uint64_t seq;
    {
      absl::MutexLock lock(&mu_);
      ++outstanding_;
      seq = next_read_++;
    }
    const uint64_t step_id = request->step_id();
    std::optional<InflightGate::Pass> pass = service_->gate_->Enter();
    if (!pass.has_value()) {
      Answer(seq, step_id, kDraining, nullptr);
    } else if (!service_->pool_->TrySchedule(
                   [this, seq, request = std::move(request),
                    pass = std::move(*pass)]() mutable {
                     auto out = std::make_unique<v1::StepStreamResponse>();
                     absl::Status st;
                     {
                       absl::ReaderMutexLock lock(&service_->mu_);
                       st = service_->Ready(/*in_group=*/true);
                     }
                     if (st.ok()) {
                       st = service_->StepTask(*request,
                                               *out->mutable_response());
                     }
                     Answer(seq, request->step_id(), ReplyStatus(st),
                            std::move(out));
                   })) {
      Answer(seq, step_id,
             ToGrpcStatus(absl::ResourceExhaustedError(
                 "the worker's step queue is full; retry later")),
             nullptr);
    }
    // Only now that this step is queued (or answered) may the next be read:
    // a read resumed by OnWriteDone cannot overtake it.
    bool read = false;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      if (write_failed_) {
        reading_done_ = true;  // The client is gone.
        finish = ShouldFinishLocked();
      } else if (outstanding_ < kMaxStreamedSteps) {
        read = true;
      } else {
        read_paused_ = true;
      }
    }
    if (read) StartRead(&request_);
    if (finish) Finish(grpc::Status::OK);
  }

  void OnWriteDone(bool ok) override {
    const v1::StepStreamResponse* next = nullptr;
    bool read = false;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      writes_.pop_front();
      --outstanding_;
      if (!ok) {
        // The client is gone: drop what is left (its reads fail too).
        write_failed_ = true;
        outstanding_ -= static_cast<int>(writes_.size() + answered_.size());
        writes_.clear();
        answered_.clear();
        if (read_paused_) reading_done_ = true;
      }
      writing_ = !writes_.empty();
      if (writing_) next = &writes_.front();
      if (read_paused_ && !reading_done_ && outstanding_ < kMaxStreamedSteps) {
        read_paused_ = false;
        read = true;
      }
      finish = ShouldFinishLocked();
    }
    if (next != nullptr) StartWrite(next);
    if (read) StartRead(&request_);
    if (finish) Finish(grpc::Status::OK);
  }

  void OnDone() override { delete this; }

 private:
  // The answer of the `seq`-th step read (`out` null for a step that did not
  // run); written once every step before it was.
  void Answer(uint64_t seq, uint64_t step_id, const grpc::Status& status,
              std::unique_ptr<v1::StepStreamResponse> out) {
    if (out == nullptr) out = std::make_unique<v1::StepStreamResponse>();
    if (!status.ok()) {
      out->Clear();
      out->set_code(static_cast<int32_t>(status.error_code()));
      out->set_message(status.error_message());
      out->set_details(status.error_details());
    }
    out->set_step_id(step_id);
    const v1::StepStreamResponse* write = nullptr;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      if (write_failed_) {
        --outstanding_;
        finish = ShouldFinishLocked();
      } else {
        answered_.emplace(seq, std::move(*out));
        // Into the write queue in read order.
        for (auto it = answered_.begin();
             it != answered_.end() && it->first == next_write_;
             it = answered_.erase(it)) {
          writes_.push_back(std::move(it->second));
          ++next_write_;
        }
        if (!writing_ && !writes_.empty()) {
          writing_ = true;
          write = &writes_.front();
        }
      }
    }
    if (write != nullptr) StartWrite(write);
    if (finish) Finish(grpc::Status::OK);
  }

  bool ShouldFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || !reading_done_ || outstanding_ > 0 || writing_) {
      return false;
    }
    finished_ = true;
    return true;
  }

  WorkerService* const service_;
  v1::StepRequest request_;
  absl::Mutex mu_;
  // Steps read and not yet written (queued, running, answered or being
  // written).
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  // The read order of the next step read, and of the next answer to write.
  uint64_t next_read_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_write_ ABSL_GUARDED_BY(mu_) = 0;
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  bool reading_done_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // Answers that came before an earlier step's, by read order.
  absl::btree_map<uint64_t, v1::StepStreamResponse> answered_
      ABSL_GUARDED_BY(mu_);
  // Answers to write, in read order; the front one is being written.
  std::deque<v1::StepStreamResponse> writes_ ABSL_GUARDED_BY(mu_);
};

grpc::ServerBidiReactor<v1::StepRequest, v1::StepStreamResponse>*
WorkerService::StepStream(grpc::CallbackServerContext* context) {
  return new StepStreamReactor(this, context);
}

absl::Status WorkerService::RunStep(const v1::StepRequest& request,
                                    v1::StepResponse& response) {
  model::Model* model;
  gpu::Communicator* comm;
  model::DsparkDrafter* drafter;
  {
    absl::ReaderMutexLock lock(&mu_);
    model = model_;
    comm = group_;
    drafter = drafter_;
  }
  for (uint64_t id : request.release_sequence_ids()) {
    model->Release(id);
    ForgetSampled(id, drafter);
  }
  if (request.prefetches_size() > 0) {
    std::vector<model::PrefetchHint> hints;
    for (const v1::PrefetchHint& h : request.prefetches()) {
      model::PrefetchHint hint;
      hint.context.assign(h.context_token_ids().begin(),
                          h.context_token_ids().end());
      hint.tokens.assign(h.token_ids().begin(), h.token_ids().end());
      hints.push_back(std::move(hint));
    }
    model->Prefetch(hints);
  }
  model::StepInput input;
  const int64_t vocab = model->dims().vocab_size;
  int64_t logits_values = 0;
  for (int i = 0; i < request.chunks_size(); ++i) {
    const v1::SequenceChunk& c = request.chunks(i);
    model::SequenceChunk chunk;
    chunk.sequence_id = c.sequence_id();
    ASSIGN_OR_RETURN(chunk.tokens, ChunkTokens(c, i));
    chunk.start_position = c.start_position();
    switch (c.output()) {
      case v1::OUTPUT_UNSPECIFIED:
      case v1::OUTPUT_NONE:
        chunk.logits = model::SequenceChunk::Logits::kNone;
        break;
      case v1::OUTPUT_SAMPLE:
        if (c.num_draft_tokens() == 0) {
          // Drawn in the step, where the logits are: the row comes to the
          // host only for the top log-probabilities.
          chunk.sample = true;
          chunk.sampling = FromProto(c.sampling());
          chunk.logits = c.top_logprobs() > 0
                             ? model::SequenceChunk::Logits::kLast
                             : model::SequenceChunk::Logits::kNone;
        } else {
          // Verified against drafts (or drawn from the row when none come).
          chunk.logits = model::SequenceChunk::Logits::kLast;
        }
        break;
      case v1::OUTPUT_LOGITS_LAST:
        chunk.logits = model::SequenceChunk::Logits::kLast;
        logits_values += vocab;
        break;
      case v1::OUTPUT_LOGITS_ALL:
        chunk.logits = model::SequenceChunk::Logits::kAll;
        logits_values += vocab * static_cast<int64_t>(chunk.tokens.size());
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "chunk ", i, ": unknown output ", static_cast<int>(c.output())));
    }
    RETURN_IF_ERROR(CheckSampling(c.sampling(), i));
    RETURN_IF_ERROR(CheckLogprobs(c, i, vocab));
    RETURN_IF_ERROR(CheckDrafts(c, i, chunk.tokens.size(), *model, drafter));
    if (c.output() == v1::OUTPUT_SAMPLE) {
      // With drafts, every new token has its log-probability and top list.
      logits_values += (1 + int64_t{std::max(c.num_draft_tokens(), 0)}) *
                       (1 + 2 * int64_t{c.top_logprobs()});
    }
    if (c.prompt_logprobs()) {
      // Every row on the host; the response carries only log-probabilities.
      chunk.logits = model::SequenceChunk::Logits::kAll;
      logits_values +=
          int64_t{c.token_ids_size()} * (1 + 2 * int64_t{c.top_logprobs()});
    }
    input.chunks.push_back(std::move(chunk));
  }
  if (logits_values > options_.max_response_logits) {
    return absl::InvalidArgumentError(
        absl::StrCat("the step asks for ", logits_values,
                     " logits and log-probability values, more than the ",
                     options_.max_response_logits, " a response may carry"));
  }
  const absl::Time start = absl::Now();
  const absl::Duration comm_before =
      comm != nullptr ? comm->stats().time : absl::ZeroDuration();
  // Drafts per chunk (their logits; empty: none), proposed before the step
  // (collective).
  ASSIGN_OR_RETURN(const std::vector<std::vector<float>> draft_logits,
                   AddDrafts(request, *model, drafter, input));
  absl::StatusOr<model::StepOutput> out = model->Step(input);
  if (!out.ok() && drafter != nullptr && !model::IsStepNotRun(out.status()) &&
      !absl::IsInvalidArgument(out.status()) &&
      !absl::IsResourceExhausted(out.status())) {
    // A step that failed in the forward pass dropped its sequences on the
    // model (model.h); the drafter drops them too.
    for (const model::SequenceChunk& c : input.chunks) {
      drafter->Release(c.sequence_id);
    }
  }
  int64_t tokens = 0;
  for (const model::SequenceChunk& c : input.chunks) {
    tokens += static_cast<int64_t>(c.tokens.size());
  }
  RecordStep(
      *model, absl::Now() - start,
      comm != nullptr ? comm->stats().time - comm_before : absl::ZeroDuration(),
      tokens, out.ok());
  if (!out.ok()) return out.status();
  response.set_step_id(request.step_id());
  // Rank 0 answers in full; the others only their sampled tokens (what the
  // coordinator checks), worker.proto StepResponse.
  const bool full = model->tp_rank() == 0;
  for (int i = 0; i < request.chunks_size(); ++i) {
    const v1::SequenceChunk& c = request.chunks(i);
    v1::ChunkResult* result = response.add_results();
    result->set_sequence_id(c.sequence_id());
    const std::vector<float>& rows = out->logits[i];
    if (input.chunks[i].sample) {
      RETURN_IF_ERROR(AnswerDrawnToken(c, input.chunks[i], out->sampled[i],
                                       rows, vocab, full, *result));
      sampled_[c.sequence_id()] = {
          out->sampled[i].id,
          c.start_position() +
              static_cast<int64_t>(input.chunks[i].tokens.size())};
      ExtendDrafter(drafter, input.chunks[i], out->taps[i],
                    static_cast<int64_t>(input.chunks[i].tokens.size()));
      continue;
    }
    if (rows.size() < static_cast<size_t>(vocab)) {
      if (c.output() == v1::OUTPUT_SAMPLE || c.prompt_logprobs() ||
          c.output() == v1::OUTPUT_LOGITS_LAST ||
          c.output() == v1::OUTPUT_LOGITS_ALL) {
        return absl::InternalError(absl::StrCat(
            "chunk ", i, ": the model returned ", rows.size(), " logits"));
      }
      ExtendDrafter(drafter, input.chunks[i], out->taps[i],
                    static_cast<int64_t>(input.chunks[i].tokens.size()));
      continue;
    }
    // The chunk's last position: the only row, or the last of all of them.
    const absl::Span<const float> last = absl::MakeConstSpan(rows).subspan(
        rows.size() - static_cast<size_t>(vocab));
    // The positions the step commits (all but rejected drafts).
    int64_t committed = static_cast<int64_t>(input.chunks[i].tokens.size());
    if (!draft_logits[i].empty()) {
      const int k = static_cast<int>(draft_logits[i].size() / vocab);
      ASSIGN_OR_RETURN(
          committed, VerifyDrafts(c, input.chunks[i], rows, draft_logits[i], k,
                                  full, *model, *result));
    } else if (c.output() == v1::OUTPUT_SAMPLE) {
      ASSIGN_OR_RETURN(const auto token,
                       model->SampleToken(last, FromProto(c.sampling())));
      result->set_token_id(token.first);
      result->set_logprob(token.second);
      sampled_[c.sequence_id()] = {
          token.first, c.start_position() +
                           static_cast<int64_t>(input.chunks[i].tokens.size())};
      if (full && c.top_logprobs() > 0) {
        ASSIGN_OR_RETURN(
            model::PositionLogprobs lp,
            model::RowLogprobs(last, token.first, c.top_logprobs()));
        result->set_logprob(lp.target_logprob);
        result->mutable_top_ids()->Add(lp.top_ids.begin(), lp.top_ids.end());
        result->mutable_top_logprobs()->Add(lp.top_logprobs.begin(),
                                            lp.top_logprobs.end());
      }
    } else if (full && c.output() == v1::OUTPUT_LOGITS_LAST) {
      result->mutable_logits()->Add(last.begin(), last.end());
    } else if (full && c.output() == v1::OUTPUT_LOGITS_ALL) {
      result->mutable_logits()->Add(rows.begin(), rows.end());
    }
    if (full && c.prompt_logprobs()) {
      RETURN_IF_ERROR(AddPositionLogprobs(c, rows, vocab, *result));
    }
    ExtendDrafter(drafter, input.chunks[i], out->taps[i], committed);
  }
  response.set_compute_micros(absl::ToInt64Microseconds(absl::Now() - start));
  if (comm != nullptr) {
    response.set_comm_micros(
        absl::ToInt64Microseconds(comm->stats().time - comm_before));
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* WorkerService::Release(
    grpc::CallbackServerContext* context, const v1::ReleaseRequest* request,
    v1::ReleaseResponse* /*response*/) {
  // Local only (no collective): also while the rank is in no group.
  return Schedule(context, /*in_group=*/false, [this, request] {
    RETURN_IF_ERROR(
        CheckOwner(request->coordinator_id(), {}, request->sequence_ids()));
    absl::ReaderMutexLock lock(&mu_);
    for (uint64_t id : request->sequence_ids()) {
      model_->Release(id);
      ForgetSampled(id, drafter_);
    }
    return absl::OkStatus();
  });
}

absl::Status WorkerService::CheckDrafts(const v1::SequenceChunk& c, int index,
                                        size_t tokens,
                                        const model::Model& model,
                                        const model::DsparkDrafter* drafter) {
  const int k = c.num_draft_tokens();
  if (k == 0) return absl::OkStatus();
  const int most = drafter == nullptr
                       ? 0
                       : std::min(drafter->block_size(),
                                  model.options().max_speculative_tokens);
  if (k < 0 || k > most) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", index, ": num_draft_tokens=", k, " must be in [0, ", most,
        "]", drafter == nullptr ? " (this worker has no drafter)" : ""));
  }
  if (c.output() != v1::OUTPUT_SAMPLE || tokens != 1 || c.prompt_logprobs()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", index,
        ": drafts go with a one-token OUTPUT_SAMPLE decode chunk without "
        "prompt_logprobs"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<float>>> WorkerService::AddDrafts(
    const v1::StepRequest& request, const model::Model& model,
    model::DsparkDrafter* drafter, model::StepInput& input) {
  std::vector<std::vector<float>> drafted(input.chunks.size());
  if (drafter == nullptr) return drafted;
  std::vector<model::DraftRequest> requests;
  std::vector<size_t> which;
  for (size_t i = 0; i < input.chunks.size(); ++i) {
    model::SequenceChunk& chunk = input.chunks[i];
    const v1::SequenceChunk& c = request.chunks(static_cast<int>(i));
    // Every chunk's taps extend the drafter's history after the step.
    chunk.taps = true;
    // Drafts need the history of every position before the anchor (a
    // sequence whose history was lost decodes without them).
    if (c.num_draft_tokens() > 0 &&
        drafter->SequenceLength(chunk.sequence_id) == chunk.start_position) {
      model::DraftRequest r;
      r.sequence_id = chunk.sequence_id;
      r.anchor = chunk.tokens[0];
      r.sampling = FromProto(c.sampling());
      // A stream of its own: draft i uses seed + i, and the next step's
      // seed is only a few above this one's.
      r.sampling.seed = model::DraftSeed(c.sampling().seed());
      requests.push_back(r);
      which.push_back(i);
    }
  }
  if (requests.empty()) return drafted;
  ASSIGN_OR_RETURN(std::vector<model::DraftProposal> proposals,
                   drafter->Propose(requests));
  const int64_t vocab = model.dims().vocab_size;
  for (size_t j = 0; j < which.size(); ++j) {
    model::SequenceChunk& chunk = input.chunks[which[j]];
    // Drafts the model cannot take (ids past the Engram tokenizer) end
    // the block there.
    const int k = model::UsableDrafts(
        proposals[j].tokens,
        request.chunks(static_cast<int>(which[j])).num_draft_tokens(),
        model.engram_vocab_size());
    if (k == 0) continue;
    chunk.tokens.insert(chunk.tokens.end(), proposals[j].tokens.begin(),
                        proposals[j].tokens.begin() + k);
    chunk.logits = model::SequenceChunk::Logits::kAll;
    proposals[j].logits.resize(static_cast<size_t>(k * vocab));
    drafted[which[j]] = std::move(proposals[j].logits);
  }
  return drafted;
}

absl::StatusOr<int64_t> WorkerService::VerifyDrafts(
    const v1::SequenceChunk& c, const model::SequenceChunk& chunk,
    absl::Span<const float> rows, absl::Span<const float> draft_logits, int k,
    bool full, model::Model& model, v1::ChunkResult& result) {
  const int64_t vocab = model.dims().vocab_size;
  const absl::Span<const int64_t> drafts =
      absl::MakeConstSpan(chunk.tokens).subspan(1, k);
  const gpu::SamplingParams sampling = FromProto(c.sampling());
  model::Verdict verdict;
  if (!(sampling.temperature > 0.0f)) {
    verdict = model::VerifyGreedy(rows, vocab, drafts);
  } else {
    std::vector<std::vector<double>> target, draft;
    for (int j = 0; j <= k; ++j) {
      target.push_back(model::SamplingDistribution(
          rows.subspan(j * vocab, vocab), sampling));
      if (j < k) {
        draft.push_back(model::SamplingDistribution(
            draft_logits.subspan(j * vocab, vocab), sampling));
      }
    }
    verdict = model::VerifySampled(
        target, draft, drafts,
        c.draft_verification() == v1::DRAFT_VERIFICATION_STANDARD
            ? model::VerifyRule::kStandard
            : model::VerifyRule::kBlock,
        sampling.seed ^ 0x5851F42D4C957F2Dull);
  }
  const int a = verdict.accepted;
  const int64_t committed = 1 + a;
  // The rejected drafts leave no trace in the model.
  RETURN_IF_ERROR(
      model.Truncate(chunk.sequence_id, chunk.start_position + committed));
  sampled_[chunk.sequence_id] = {verdict.next,
                                 chunk.start_position + committed};
  result.set_num_draft_tokens(k);
  for (int j = 0; j <= a; ++j) {
    const int64_t token = j < a ? drafts[j] : verdict.next;
    ASSIGN_OR_RETURN(model::PositionLogprobs lp,
                     model::RowLogprobs(rows.subspan(j * vocab, vocab), token,
                                        full ? c.top_logprobs() : 0));
    result.add_new_token_ids(token);
    if (j == a) {
      result.set_token_id(token);
      result.set_logprob(lp.target_logprob);
    }
    if (!full) continue;
    v1::PositionLogprobs* p = result.add_new_tokens();
    p->set_target_logprob(lp.target_logprob);
    p->mutable_top_ids()->Add(lp.top_ids.begin(), lp.top_ids.end());
    p->mutable_top_logprobs()->Add(lp.top_logprobs.begin(),
                                   lp.top_logprobs.end());
  }
  return committed;
}

void WorkerService::ExtendDrafter(model::DsparkDrafter* drafter,
                                  const model::SequenceChunk& chunk,
                                  const std::vector<float>& taps,
                                  int64_t committed) {
  if (drafter == nullptr || committed <= 0 || taps.empty()) return;
  const uint64_t id = chunk.sequence_id;
  // A sequence (re)started from position 0 starts a new history.
  if (chunk.start_position == 0) drafter->Release(id);
  if (drafter->SequenceLength(id) != chunk.start_position &&
      !(chunk.start_position == 0 && drafter->SequenceLength(id) < 0)) {
    return;  // Its history has a gap: it decodes without drafts.
  }
  const size_t n = chunk.tokens.size();
  absl::Span<const float> rows = taps;
  if (static_cast<size_t>(committed) < n) {
    // A verify chunk (its taps cover all its positions): its committed
    // prefix.
    rows = rows.subspan(0, taps.size() / n * static_cast<size_t>(committed));
  }
  const absl::Status st =
      drafter->Extend(id, chunk.start_position, committed, rows);
  if (!st.ok()) {
    LOG(WARNING) << "sequence " << id
                 << " decodes without drafts from now on: " << st;
    drafter->Release(id);
  }
}

absl::StatusOr<std::vector<int64_t>> WorkerService::ChunkTokens(
    const v1::SequenceChunk& c, int index) const {
  std::vector<int64_t> tokens;
  if (!c.starts_with_sampled_token()) {
    tokens.assign(c.token_ids().begin(), c.token_ids().end());
    return tokens;
  }
  if (c.prompt_logprobs()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", index,
        ": starts_with_sampled_token cannot be combined with prompt_logprobs"));
  }
  const auto it = sampled_.find(c.sequence_id());
  if (it == sampled_.end() || it->second.position != c.start_position()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", index, ": sequence ", c.sequence_id(),
        " has no sampled token at position ", c.start_position(),
        " to start with (its previous step did not run or sampled elsewhere)"));
  }
  tokens.reserve(1 + static_cast<size_t>(c.token_ids_size()));
  tokens.push_back(it->second.token);
  tokens.insert(tokens.end(), c.token_ids().begin(), c.token_ids().end());
  return tokens;
}

absl::Status WorkerService::ClaimSequences(const v1::StepRequest& request) {
  std::vector<uint64_t> run;
  run.reserve(request.chunks_size());
  for (const v1::SequenceChunk& c : request.chunks()) {
    run.push_back(c.sequence_id());
  }
  return CheckOwner(request.coordinator_id(), run,
                    request.release_sequence_ids());
}

absl::Status WorkerService::CheckOwner(
    absl::string_view coordinator, absl::Span<const uint64_t> run,
    const google::protobuf::RepeatedField<uint64_t>& release) {
  if (coordinator.size() > kMaxCoordinatorIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinator_id is ", coordinator.size(),
                     " bytes, more than ", kMaxCoordinatorIdBytes));
  }
  absl::MutexLock lock(&owners_mu_);
  auto check = [&](uint64_t id) -> absl::Status {
    const auto it = owners_.find(id);
    if (it != owners_.end() && it->second != coordinator) {
      return absl::PermissionDeniedError(absl::StrCat(
          "sequence ", id,
          " belongs to another coordinator; a coordinator may only run and "
          "release the sequences it created"));
    }
    return absl::OkStatus();
  };
  for (const uint64_t id : run) RETURN_IF_ERROR(check(id));
  for (const uint64_t id : release) RETURN_IF_ERROR(check(id));
  for (const uint64_t id : release) owners_.erase(id);
  for (const uint64_t id : run) {
    if (!owners_.contains(id)) owners_.emplace(id, std::string(coordinator));
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* WorkerService::GetInfo(
    grpc::CallbackServerContext* context, const v1::GetInfoRequest* /*request*/,
    v1::GetInfoResponse* response) {
  return Schedule(context, /*in_group=*/false, [this, response] {
    absl::ReaderMutexLock lock(&mu_);
    const model::Model& m = *model_;
    response->set_rank(m.tp_rank());
    response->set_tp_size(m.tp_size());
    response->set_backend(backend_->name());
    response->set_checkpoint_dir(m.checkpoint_dir());
    response->set_vocab_size(m.dims().vocab_size);
    response->set_engram_vocab_size(m.engram_vocab_size());
    response->set_num_layers(m.dims().num_layers);
    response->set_eos_token_id(m.dims().eos_token_id);
    response->set_weight_bytes(m.weight_bytes());
    response->set_kv_blocks_total(m.kv_cache().num_blocks());
    response->set_kv_blocks_free(m.kv_cache().free_blocks());
    response->set_kv_block_rows(m.kv_cache().block_rows());
    response->set_sequences(m.num_sequences());
    response->set_ready(true);
    const model::KvCache& kv = m.kv_cache();
    response->set_kv_bytes_total(int64_t{kv.num_blocks()} * kv.block_bytes());
    response->set_kv_fixed_bytes_per_sequence(m.KvFixedBlocksPerSequence() *
                                              kv.block_bytes());
    response->set_kv_bytes_per_token(m.KvBytesPerToken());
    response->set_dcp_size(m.options().dcp_size);
    response->set_dcp_interleave(m.options().dcp_interleave);
    response->set_sliding_window(m.dims().sliding_window);
    response->set_in_group(InGroup());
    response->set_max_draft_tokens(
        drafter_ == nullptr ? 0
                            : std::min(drafter_->block_size(),
                                       m.options().max_speculative_tokens));
    response->set_group_generation(group_ != nullptr ? group_->generation()
                                                     : 0);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* WorkerService::JoinGroup(
    grpc::CallbackServerContext* context, const v1::JoinGroupRequest* request,
    v1::JoinGroupResponse* response) {
  return Schedule(context, /*in_group=*/false, [this, request, response] {
    const int64_t generation = request->generation();
    if (generation <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "JoinGroupRequest.generation=", generation, " must be positive"));
    }
    if (request->coordinator_id().size() > kMaxCoordinatorIdBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("JoinGroupRequest.coordinator_id is longer than ",
                       kMaxCoordinatorIdBytes, " bytes"));
    }
    response->set_generation(generation);
    absl::MutexLock lock(&mu_);
    if (group_ != nullptr && group_->generation() == generation && InGroup()) {
      return absl::OkStatus();  // Already there: keep the sequences.
    }
    // The peers' halves of every sequence are gone (or about to be).
    model_->ReleaseAll();
    sampled_.clear();
    if (drafter_ != nullptr) drafter_->ReleaseAll();
    {
      absl::MutexLock owners(&owners_mu_);
      owners_.clear();
    }
    if (group_ != nullptr) {
      LOG(INFO) << "joining group generation " << generation;
      RETURN_IF_ERROR(group_->Join(generation));
      LOG(INFO) << "in group generation " << generation;
    }
    broken_ = absl::OkStatus();
    if (options_.on_joined) options_.on_joined(generation);
    return absl::OkStatus();
  });
}

}  // namespace mneme::worker
