#include "services/coordinator/engine.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "services/coordinator/request_validator.h"

namespace mneme::coordinator {
namespace {

namespace v1 = worker::v1;

// Tokens of n-gram history a prefetch hint carries.
constexpr int64_t kPrefetchContext = 3;

// The prompt positions of chunk `s` whose log-probabilities `have` entries
// do not yet cover: [first, last). Position p gives entry p + 1, so the
// prompt's last position gives none. Chunks come in stream order (a
// recompute starts again at 0), so `first` is never before the chunk.
std::pair<int64_t, int64_t> MissingPromptPositions(int64_t have,
                                                   int64_t prompt_tokens,
                                                   const ScheduledSequence& s) {
  const int64_t first = have - 1;
  const int64_t last =
      std::min(s.start_position + s.num_tokens, prompt_tokens - 1);
  if (have < 1 || first < s.start_position || first >= last) return {0, 0};
  return {first, last};
}

// The first n entries of a top list from the workers.
TopLogprobs TopFromProto(const google::protobuf::RepeatedField<int64_t>& ids,
                         const google::protobuf::RepeatedField<float>& values,
                         int n) {
  TopLogprobs top;
  const int k = std::min({n, ids.size(), values.size()});
  top.token_ids.assign(ids.begin(), ids.begin() + k);
  top.logprobs.assign(values.begin(), values.begin() + k);
  return top;
}

std::vector<double> LatencyBuckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
          1,     2,     5,    10,   20,   50,  100};
}

}  // namespace

struct Engine::Live {
  std::string name;
  GenerateParams params;
  absl::flat_hash_set<int64_t> stops;
  // Prompt, then the generated tokens.
  std::vector<int64_t> tokens;
  int64_t prompt_tokens = 0;
  int64_t generated = 0;
  std::shared_ptr<GenerateSink> sink;
  absl::Time arrival;
  bool scheduled = false;
  absl::Time last_token;
  // With params.prompt_logprobs >= 0: the prompt's entries gathered so far
  // (entry 0 from the start), until they are handed to the sink.
  std::vector<TokenLogprobs> prompt_logprobs;
  bool prompt_logprobs_sent = false;
  // Times its worker state was lost (and recomputed).
  int recoveries = 0;
  SpeculationUsage speculation;
};

struct Engine::Metrics {
  Histogram* ttft = nullptr;
  Histogram* itl = nullptr;
  Histogram* e2e = nullptr;
  Histogram* queue = nullptr;
  Histogram* step = nullptr;
  Histogram* schedule = nullptr;
  Counter* prompt_tokens = nullptr;
  Counter* generation_tokens = nullptr;
  Counter* finished_stop = nullptr;
  Counter* finished_length = nullptr;
  Counter* finished_abort = nullptr;
  Counter* finished_error = nullptr;
  Counter* worker_failures = nullptr;
  Counter* group_reforms = nullptr;
  Counter* spec_drafts = nullptr;
  Counter* spec_draft_tokens = nullptr;
  Counter* spec_accepted_tokens = nullptr;
  std::vector<Counter*> spec_per_pos;
};

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(
    const EngineOptions& options, WorkerGroup* workers,
    MetricsRegistry* metrics) {
  if (workers == nullptr || metrics == nullptr) {
    return absl::InvalidArgumentError("workers and metrics are required");
  }
  if (options.ready_poll_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ready_poll_interval must be positive");
  }
  if (options.max_prefetch_hints < 0) {
    return absl::InvalidArgumentError("max_prefetch_hints must be >= 0");
  }
  std::unique_ptr<Engine> engine(new Engine(options, workers));
  auto m = std::make_unique<Metrics>();
  absl::Status st;
  auto histogram = [&](const char* name, const char* help) -> Histogram* {
    absl::StatusOr<HistogramFamily*> f = metrics->AddHistogram(
        {.name = name, .help = help, .label_names = {}}, LatencyBuckets());
    if (!f.ok()) {
      st.Update(f.status());
      return nullptr;
    }
    absl::StatusOr<Histogram*> h = (*f)->Get();
    st.Update(h.status());
    return h.ok() ? *h : nullptr;
  };
  auto counter = [&](const char* name, const char* help,
                     std::vector<std::string> labels,
                     const std::vector<std::vector<absl::string_view>>& values)
      -> std::vector<Counter*> {
    std::vector<Counter*> out;
    absl::StatusOr<CounterFamily*> f = metrics->AddCounter(
        {.name = name, .help = help, .label_names = std::move(labels)});
    if (!f.ok()) {
      st.Update(f.status());
      return std::vector<Counter*>(values.size(), nullptr);
    }
    for (const auto& v : values) {
      absl::StatusOr<Counter*> c = (*f)->Get(v);
      st.Update(c.status());
      out.push_back(c.ok() ? *c : nullptr);
    }
    return out;
  };
  m->ttft = histogram("mneme:time_to_first_token_seconds",
                      "Time from arrival to the first new token.");
  m->itl = histogram("mneme:inter_token_latency_seconds",
                     "Time between consecutive new tokens of a request.");
  m->e2e = histogram("mneme:e2e_request_latency_seconds",
                     "Time from arrival to the end of a request.");
  m->queue = histogram("mneme:request_queue_time_seconds",
                       "Time from arrival to the first scheduled step.");
  m->step = histogram("mneme:step_seconds",
                      "Wall time of one step on the worker group (a step sent "
                      "ahead counts from the end of the one before).");
  m->schedule = histogram("mneme:scheduler_seconds",
                          "Time the scheduler takes to plan one step.");
  m->prompt_tokens =
      counter("mneme:prompt_tokens_total",
              "Prompt tokens of admitted requests.", {}, {{}})[0];
  m->generation_tokens = counter("mneme:generation_tokens_total",
                                 "Tokens generated.", {}, {{}})[0];
  std::vector<Counter*> finished = counter(
      "mneme:request_success_total", "Requests finished, by finish reason.",
      {"finished_reason"}, {{"stop"}, {"length"}, {"abort"}, {"error"}});
  m->finished_stop = finished[0];
  m->finished_length = finished[1];
  m->finished_abort = finished[2];
  m->finished_error = finished[3];
  // Speculative decoding, as vLLM names its counters.
  m->spec_drafts =
      counter("mneme:spec_decode_num_drafts_total",
              "Decode steps of a request that verified drafts.", {}, {{}})[0];
  m->spec_draft_tokens =
      counter("mneme:spec_decode_num_draft_tokens_total",
              "Draft tokens proposed and verified.", {}, {{}})[0];
  m->spec_accepted_tokens =
      counter("mneme:spec_decode_num_accepted_tokens_total",
              "Draft tokens accepted.", {}, {{}})[0];
  {
    std::vector<std::string> positions;
    std::vector<std::vector<absl::string_view>> values;
    const int64_t k = options.scheduler.num_speculative_tokens;
    positions.reserve(std::max<int64_t>(k, 0));
    values.reserve(std::max<int64_t>(k, 0));
    for (int64_t j = 0; j < k; ++j) positions.push_back(absl::StrCat(j));
    for (const std::string& p : positions) values.push_back({p});
    m->spec_per_pos =
        counter("mneme:spec_decode_num_accepted_tokens_per_pos_total",
                "Draft tokens accepted, by draft position (0: the first).",
                {"position"}, values);
  }
  m->worker_failures =
      counter("mneme:worker_failures_total",
              "Steps that failed on the worker group.", {}, {{}})[0];
  m->group_reforms =
      counter("mneme:worker_group_reforms_total",
              "Times the workers re-formed their tensor-parallel group (a "
              "rank restarted or a collective failed).",
              {}, {{}})[0];
  if (!st.ok()) return st;
  Engine* e = engine.get();
  for (auto [name, help, fn] : std::vector<
           std::tuple<const char*, const char*, std::function<double()>>>{
           {"mneme:num_requests_running", "Requests running on the workers.",
            [e] { return static_cast<double>(e->loads().running); }},
           {"mneme:num_requests_waiting", "Requests waiting to run.",
            [e] { return static_cast<double>(e->loads().waiting); }},
           {"mneme:kv_cache_usage_perc",
            "Fraction of the KV cache in use (0-1), all ranks.",
            [e] { return e->loads().kv_usage; }},
           {"mneme:ready", "1 when every worker is ready.",
            [e] { return e->ready() ? 1.0 : 0.0; }},
       }) {
    RETURN_IF_ERROR(metrics->AddCallbackGauge(
        {.name = name, .help = help, .label_names = {}}, fn));
  }
  engine->metrics_ = std::move(m);
  return engine;
}

Engine::Engine(const EngineOptions& options, WorkerGroup* workers)
    : options_(options), workers_(workers) {}

Engine::~Engine() { Stop(); }

void Engine::Start() {
  absl::MutexLock lock(&mu_);
  if (thread_.joinable() || stopping_) return;
  last_loop_ = absl::Now();
  thread_ = std::thread([this] { Loop(); });
}

void Engine::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    wake_ = true;
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  std::vector<RequestId> ids;
  for (const auto& [id, live] : live_) ids.push_back(id);
  for (RequestId id : ids) {
    if (scheduler_ != nullptr) (void)scheduler_->Abort(id);  // May be gone.
    Finish(id, absl::UnavailableError("the coordinator is shutting down"),
           GenerateEnd::kAbort);
  }
}

bool Engine::ready() const {
  absl::MutexLock lock(&mu_);
  return ready_;
}

bool Engine::AwaitReady(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&ready_), timeout);
  return ready_;
}

bool Engine::alive() const {
  absl::MutexLock lock(&mu_);
  // The loop comes round at least every poll interval or step timeout.
  return !stopping_ && absl::Now() - last_loop_ < absl::Minutes(5);
}

absl::StatusOr<ModelInfo> Engine::model_info() const {
  absl::MutexLock lock(&mu_);
  if (!info_.has_value()) {
    return absl::FailedPreconditionError("the workers have not been ready yet");
  }
  return *info_;
}

Loads Engine::loads() const {
  absl::MutexLock lock(&mu_);
  Loads l;
  if (scheduler_ == nullptr) return l;
  l.running = scheduler_->num_running();
  l.waiting = scheduler_->num_waiting();
  l.waiting_tokens = scheduler_->num_queued_tokens();
  l.kv_usage = scheduler_->kv_usage();
  l.preemptions = scheduler_->num_preemptions();
  return l;
}

absl::StatusOr<std::string> Engine::Submit(GenerateParams params,
                                           std::shared_ptr<GenerateSink> sink) {
  absl::MutexLock lock(&mu_);
  const auto prompt_tokens = static_cast<double>(params.prompt.size());
  absl::StatusOr<std::string> name =
      SubmitLocked(std::move(params), std::move(sink));
  if (name.ok()) metrics_->prompt_tokens->Increment(prompt_tokens);
  return name;
}

absl::StatusOr<std::vector<std::string>> Engine::SubmitAll(
    std::vector<GenerateParams> params,
    std::vector<std::shared_ptr<GenerateSink>> sinks) {
  if (params.size() != sinks.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(params.size(), " requests but ", sinks.size(), " sinks"));
  }
  absl::MutexLock lock(&mu_);
  double prompt_tokens = 0;
  for (const GenerateParams& p : params) {
    prompt_tokens += static_cast<double>(p.prompt.size());
  }
  std::vector<std::string> names;
  names.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    absl::StatusOr<std::string> name =
        SubmitLocked(std::move(params[i]), std::move(sinks[i]));
    if (!name.ok()) {
      // All or none: the ones already queued leave without a trace (their
      // sinks hear nothing; nothing has run).
      for (const std::string& n : names) {
        auto it = by_name_.find(n);
        if (it == by_name_.end()) continue;
        (void)scheduler_->Abort(it->second);
        live_.erase(it->second);
        by_name_.erase(it);
      }
      return name.status();
    }
    names.push_back(*std::move(name));
  }
  metrics_->prompt_tokens->Increment(prompt_tokens);
  return names;
}

absl::StatusOr<std::string> Engine::SubmitLocked(
    GenerateParams params, std::shared_ptr<GenerateSink> sink) {
  if (stopping_) {
    return absl::UnavailableError("the coordinator is shutting down");
  }
  if (!ready_ || scheduler_ == nullptr) {
    return absl::UnavailableError(
        "the cluster is not ready: waiting for every worker");
  }
  RETURN_IF_ERROR(
      ValidateGenerateRequest(params, /*num_stop_strings=*/0, &*info_));
  const RequestId id = next_id_;
  std::string name =
      params.request_id.empty() ? absl::StrCat("req-", id) : params.request_id;
  if (by_name_.contains(name)) {
    return absl::AlreadyExistsError(
        absl::StrCat("request ", name, " is already running"));
  }
  Request request;
  request.id = id;
  request.num_prompt_tokens = static_cast<int64_t>(params.prompt.size());
  request.max_new_tokens = params.max_new_tokens;
  request.speculative = params.speculative;
  RETURN_IF_ERROR(scheduler_->AddRequest(request));
  ++next_id_;
  auto live = std::make_unique<Live>();
  live->name = name;
  live->tokens = params.prompt;
  live->prompt_tokens = request.num_prompt_tokens;
  live->stops.insert(params.stop_token_ids.begin(),
                     params.stop_token_ids.end());
  if (params.prompt_logprobs >= 0) {
    live->prompt_logprobs.reserve(params.prompt.size());
    TokenLogprobs first;
    first.token_id = params.prompt.front();
    live->prompt_logprobs.push_back(std::move(first));
  }
  if (!params.ignore_eos) live->stops.insert(info_->eos_token_id);
  live->params = std::move(params);
  live->params.prompt.clear();  // Kept once, in tokens.
  live->sink = std::move(sink);
  live->arrival = absl::Now();
  by_name_[name] = id;
  live_[id] = std::move(live);
  wake_ = true;
  return name;
}

absl::Status Engine::Abort(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(request_id);
  if (it == by_name_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no running or queued request ", request_id));
  }
  const RequestId id = it->second;
  if (scheduler_ != nullptr) {
    // NotFound only if it finished in this very step; nothing to undo then.
    (void)scheduler_->Abort(id);
  }
  to_release_.push_back(id);
  Finish(id, absl::OkStatus(), GenerateEnd::kAbort);
  wake_ = true;
  return absl::OkStatus();
}

void Engine::Finish(RequestId id, const absl::Status& status, GenerateEnd end) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  Live& l = *it->second;
  if (!status.ok()) {
    metrics_->finished_error->Increment();
  } else if (end == GenerateEnd::kStop) {
    metrics_->finished_stop->Increment();
  } else if (end == GenerateEnd::kLength) {
    metrics_->finished_length->Increment();
  } else {
    metrics_->finished_abort->Increment();
  }
  metrics_->e2e->Observe(absl::ToDoubleSeconds(absl::Now() - l.arrival));
  if (l.speculation.drafts > 0) l.sink->OnSpeculation(l.speculation);
  l.sink->OnFinish(status, end, l.prompt_tokens, l.generated);
  by_name_.erase(l.name);
  live_.erase(it);
}

void Engine::RequeueRunning(absl::string_view why) {
  if (scheduler_ == nullptr) return;
  ++epoch_;
  for (const RequestId id : scheduler_->RequeueRunning()) {
    // The surviving ranks may still hold the sequence: release it before it
    // is recomputed (a re-formed group has forgotten it anyway).
    to_release_.push_back(id);
    auto it = live_.find(id);
    if (it == live_.end()) continue;
    if (++it->second->recoveries > kMaxRecoveries) {
      // A request that keeps losing its workers may be what kills them.
      (void)scheduler_->Abort(id);
      Finish(id,
             absl::UnavailableError(
                 absl::StrCat("the request lost its worker state ",
                              kMaxRecoveries + 1, " times (last: ", why, ")")),
             GenerateEnd::kAbort);
    }
  }
}

bool Engine::ReformGroup(const std::vector<v1::GetInfoResponse>& info) {
  int64_t generation = 0;
  std::string why;
  for (const v1::GetInfoResponse& w : info) {
    generation = std::max(generation, w.group_generation());
    absl::StrAppend(&why, why.empty() ? "" : ", ", "rank ", w.rank(),
                    w.in_group() ? " in" : " out of", " generation ",
                    w.group_generation());
  }
  ++generation;
  {
    absl::MutexLock lock(&mu_);
    ready_ = false;
    RequeueRunning(absl::StrCat("the worker group re-formed: ", why));
  }
  LOG(WARNING) << "re-forming the worker group as generation " << generation
               << " (" << why << ")";
  const absl::Status st = workers_->JoinGroup(generation);
  if (!st.ok()) {
    LOG(WARNING) << "re-forming the worker group failed: " << st;
    return false;
  }
  absl::MutexLock lock(&mu_);
  // Every rank forgot every sequence.
  to_release_.clear();
  metrics_->group_reforms->Increment();
  LOG(INFO) << "the worker group is whole again (generation " << generation
            << ")";
  return true;
}

bool Engine::CheckReady() {
  absl::StatusOr<std::vector<v1::GetInfoResponse>> info = workers_->Info();
  if (!info.ok()) {
    LOG_EVERY_N(INFO, 50) << "waiting for the workers: " << info.status();
    return false;
  }
  if (!GroupIsWhole(*info)) {
    if (!ReformGroup(*info)) return false;
    info = workers_->Info();
    if (!info.ok() || !GroupIsWhole(*info)) return false;
  }
  const v1::GetInfoResponse& first = info->front();
  int64_t pool_bytes = first.kv_bytes_total();
  for (const v1::GetInfoResponse& w : *info) {
    pool_bytes = std::min(pool_bytes, w.kv_bytes_total());
    if (w.vocab_size() != first.vocab_size() ||
        w.checkpoint_dir() != first.checkpoint_dir() ||
        w.dcp_size() != first.dcp_size() ||
        w.max_draft_tokens() != first.max_draft_tokens()) {
      LOG_EVERY_N(ERROR, 50)
          << "the workers disagree on the model, DCP or speculation (rank "
          << w.rank() << ": " << w.checkpoint_dir() << ", vocab "
          << w.vocab_size() << ", dcp " << w.dcp_size() << ", drafts "
          << w.max_draft_tokens() << "); not ready";
      return false;
    }
    // Checked every time the group is (re)formed: a rank restarted without
    // a drafter would refuse every decode.
    if (w.max_draft_tokens() < options_.scheduler.num_speculative_tokens) {
      LOG_EVERY_N(ERROR, 50)
          << "num_speculative_tokens="
          << options_.scheduler.num_speculative_tokens << " but worker rank "
          << w.rank() << " verifies at most " << w.max_draft_tokens()
          << " drafts a step (run the workers with --num_speculative_tokens "
             ">= it, on a checkpoint with DSpark stages); not ready";
      return false;
    }
  }
  absl::MutexLock lock(&mu_);
  if (scheduler_ == nullptr) {
    SchedulerOptions so = options_.scheduler;
    KvBlockPoolOptions& kv = so.kv_pool;
    // Every running sequence holds fixed state (windows, compressor blocks)
    // beside its tokens' entries. When max_num_seqs sequences' fixed state
    // would take more than half the pool, fewer run at once.
    const int64_t fixed =
        std::max<int64_t>(first.kv_fixed_bytes_per_sequence(), 1);
    if (so.max_num_seqs * fixed > pool_bytes / 2 && pool_bytes / 2 >= fixed) {
      const int64_t fit = pool_bytes / 2 / fixed;
      LOG(WARNING) << "max_num_seqs lowered from " << so.max_num_seqs << " to "
                   << fit << ": the workers' KV cache (" << pool_bytes
                   << " bytes per rank) holds the fixed state (" << fixed
                   << " bytes per sequence) of that many in half of it; raise "
                      "the workers' --kv_cache_bytes for more";
      so.max_num_seqs = fit;
    }
    const int64_t usable = pool_bytes - so.max_num_seqs * fixed;
    kv.bytes_per_rank =
        kv.bytes_per_rank > 0 ? std::min(kv.bytes_per_rank, usable) : usable;
    kv.bytes_per_token = std::max<int64_t>(first.kv_bytes_per_token(), 1);
    kv.block_size_tokens = first.kv_block_rows();
    kv.dcp_size = first.dcp_size();
    kv.dcp_interleave = first.dcp_interleave();
    kv.sliding_window_tokens = first.sliding_window();
    if (kv.bytes_per_rank <= 0) {
      LOG_EVERY_N(ERROR, 50)
          << "the workers' KV cache (" << pool_bytes
          << " bytes per rank) cannot hold max_num_seqs=" << so.max_num_seqs
          << " sequences of " << first.kv_fixed_bytes_per_sequence()
          << " fixed bytes each; lower max_num_seqs or raise the workers' "
             "--kv_cache_bytes";
      return false;
    }
    if (so.max_context_tokens <= 0) {
      // The longest sequence the pool holds on every rank, found by
      // shrinking from an estimate.
      const int64_t per_rank_tokens = kv.bytes_per_rank / kv.bytes_per_token;
      so.max_context_tokens =
          std::max<int64_t>(1, (per_rank_tokens - kv.sliding_window_tokens -
                                4 * kv.block_size_tokens) *
                                   kv.dcp_size);
    }
    absl::StatusOr<std::unique_ptr<Scheduler>> scheduler;
    for (int attempt = 0; attempt < 40; ++attempt) {
      so.max_queued_tokens =
          std::max(so.max_queued_tokens, so.max_context_tokens);
      scheduler = Scheduler::Create(so);
      if (scheduler.ok() || options_.scheduler.max_context_tokens > 0) break;
      so.max_context_tokens = so.max_context_tokens * 9 / 10;
    }
    if (!scheduler.ok()) {
      LOG_EVERY_N(ERROR, 50)
          << "cannot schedule on these workers: " << scheduler.status();
      return false;
    }
    scheduler_ = *std::move(scheduler);
    ModelInfo mi;
    mi.checkpoint = first.checkpoint_dir();
    mi.vocab_size = first.vocab_size();
    mi.engram_vocab_size = first.engram_vocab_size();
    mi.eos_token_id = first.eos_token_id();
    mi.max_context_tokens = so.max_context_tokens;
    mi.tp_size = first.tp_size();
    mi.dcp_size = first.dcp_size();
    info_ = mi;
    LOG(INFO) << "workers ready: " << info->size() << " ranks, KV "
              << kv.bytes_per_rank << " bytes per rank for the scheduler, "
              << "max context " << so.max_context_tokens << " tokens";
  } else {
    LOG(INFO) << "workers ready again";
  }
  ready_ = true;
  return true;
}

v1::StepRequest Engine::BuildStep(const StepPlan& plan) {
  v1::StepRequest req;
  req.set_step_id(plan.step_id);
  for (RequestId id : to_release_) req.add_release_sequence_ids(id);
  for (RequestId id : plan.preempted) req.add_release_sequence_ids(id);
  to_release_.clear();
  int hints = 0;
  const absl::Time now = absl::Now();
  for (const ScheduledSequence& s : plan.sequences) {
    Live& l = *live_.at(s.id);
    if (!l.scheduled) {
      l.scheduled = true;
      metrics_->queue->Observe(absl::ToDoubleSeconds(now - l.arrival));
    }
    v1::SequenceChunk* c = req.add_chunks();
    c->set_sequence_id(s.id);
    // A decode planned ahead: its token is the one the step in flight
    // samples, which the workers keep; it will be this request's next.
    const int64_t pending = s.starts_with_pending_token ? 1 : 0;
    if (pending != 0) {
      c->set_starts_with_sampled_token(true);
    } else {
      // A decode with drafts sends its anchor; the workers draft the rest.
      c->mutable_token_ids()->Add(l.tokens.begin() + s.start_position,
                                  l.tokens.begin() + s.start_position +
                                      s.num_tokens - s.num_draft_tokens);
    }
    if (s.num_draft_tokens > 0) {
      c->set_num_draft_tokens(static_cast<int32_t>(s.num_draft_tokens));
      c->set_draft_verification(options_.draft_verification);
    }
    c->set_start_position(s.start_position);
    int top = 0;
    if (!l.prompt_logprobs_sent && l.params.prompt_logprobs >= 0) {
      const auto [first, last] = MissingPromptPositions(
          static_cast<int64_t>(l.prompt_logprobs.size()), l.prompt_tokens, s);
      if (first < last) {
        c->set_prompt_logprobs(true);
        top = l.params.prompt_logprobs;
        const int64_t next = s.start_position + s.num_tokens;
        if (next < static_cast<int64_t>(l.tokens.size())) {
          c->set_next_token_id(l.tokens[next]);
        }
      }
    }
    if (s.output == ChunkOutput::kSample) {
      c->set_output(v1::OUTPUT_SAMPLE);
      *c->mutable_sampling() = l.params.sampling;
      c->mutable_sampling()->set_seed(l.params.sampling.seed() +
                                      static_cast<uint64_t>(l.generated) +
                                      static_cast<uint64_t>(pending));
      if (l.params.logprobs) top = std::max(top, l.params.top_logprobs);
    }
    // One N serves both lists; each is cut to its own N on the way back.
    c->set_top_logprobs(top);
    if (s.output != ChunkOutput::kSample) {
      c->set_output(v1::OUTPUT_NONE);
      // The rest of the prompt comes in later steps: stage its rows now.
      const int64_t next = s.start_position + s.num_tokens;
      const int64_t end = std::min<int64_t>(
          static_cast<int64_t>(l.tokens.size()),
          next + scheduler_->options().max_num_batched_tokens);
      if (hints < options_.max_prefetch_hints && next < end) {
        v1::PrefetchHint* h = req.add_prefetches();
        h->mutable_context_token_ids()->Add(
            l.tokens.begin() + std::max<int64_t>(0, next - kPrefetchContext),
            l.tokens.begin() + next);
        h->mutable_token_ids()->Add(l.tokens.begin() + next,
                                    l.tokens.begin() + end);
        ++hints;
      }
    }
  }
  return req;
}

void Engine::ApplyResults(const StepPlan& plan,
                          const v1::StepResponse& response) {
  if (response.results_size() != static_cast<int>(plan.sequences.size())) {
    FailStep(plan, absl::InternalError(absl::StrCat(
                       "the workers returned ", response.results_size(),
                       " results for ", plan.sequences.size(), " sequences")));
    return;
  }
  StepResult result;
  result.step_id = plan.step_id;
  const absl::Time now = absl::Now();
  for (size_t i = 0; i < plan.sequences.size(); ++i) {
    const ScheduledSequence& s = plan.sequences[i];
    auto it = live_.find(s.id);
    if (it == live_.end()) continue;  // Aborted while the step ran.
    Live& l = *it->second;
    const v1::ChunkResult& cr = response.results(static_cast<int>(i));
    if (absl::Status st = TakePromptLogprobs(l, s, cr); !st.ok()) {
      // This request only: it leaves the step's results.
      LOG(ERROR) << "request " << l.name << ": " << st;
      (void)scheduler_->Abort(s.id);  // It is running: found.
      to_release_.push_back(s.id);
      Finish(s.id, st, GenerateEnd::kAbort);
      continue;
    }
    SequenceResult r;
    r.id = s.id;
    if (s.output == ChunkOutput::kSample) {
      // The new tokens: the accepted drafts and the target's token, or the
      // one sampled token; cut after a stop token.
      std::vector<int64_t> tokens;
      std::vector<float> lps;
      std::vector<TopLogprobs> tops;
      const bool top = l.params.logprobs && l.params.top_logprobs > 0;
      if (cr.new_token_ids_size() > 0) {
        for (int j = 0; j < cr.new_token_ids_size(); ++j) {
          tokens.push_back(cr.new_token_ids(j));
          const bool have = j < cr.new_tokens_size();
          lps.push_back(have ? cr.new_tokens(j).target_logprob()
                             : std::numeric_limits<float>::quiet_NaN());
          if (top) {
            tops.push_back(have ? TopFromProto(cr.new_tokens(j).top_ids(),
                                               cr.new_tokens(j).top_logprobs(),
                                               l.params.top_logprobs)
                                : TopLogprobs{});
          }
        }
        RecordDrafts(cr, l);
      } else {
        tokens.push_back(cr.token_id());
        lps.push_back(cr.logprob());
        if (top) {
          tops.push_back(TopFromProto(cr.top_ids(), cr.top_logprobs(),
                                      l.params.top_logprobs));
        }
      }
      size_t n = 0;
      while (n < tokens.size() && !r.stopped) {
        r.stopped = l.stops.contains(tokens[n]);
        ++n;
      }
      tokens.resize(n);
      lps.resize(n);
      if (top) tops.resize(n);
      const absl::Duration since =
          l.generated == 0 ? now - l.arrival : now - l.last_token;
      for (size_t j = 0; j < n; ++j) {
        l.tokens.push_back(tokens[j]);
        l.generated += 1;
        if (l.generated == 1) {
          metrics_->ttft->Observe(absl::ToDoubleSeconds(since));
        } else {
          // A step's tokens share its time.
          metrics_->itl->Observe(absl::ToDoubleSeconds(since) /
                                 static_cast<double>(n));
        }
      }
      r.num_new_tokens = static_cast<int64_t>(n);
      l.last_token = now;
      metrics_->generation_tokens->Increment(static_cast<double>(n));
      if (top) l.sink->OnTopLogprobs(tops);
      if (!l.sink->OnTokens(tokens, l.params.logprobs
                                        ? absl::Span<const float>(lps)
                                        : absl::Span<const float>())) {
        r.stopped = true;
      }
    }
    result.sequences.push_back(r);
  }
  absl::StatusOr<std::vector<FinishedRequest>> finished =
      scheduler_->OnStepDone(result);
  if (!finished.ok()) {
    // A bookkeeping bug; fail the step's requests rather than hang them.
    LOG(ERROR) << "scheduler refused the step's results: " << finished.status();
    FailStep(plan, absl::InternalError(finished.status().message()));
    return;
  }
  for (const FinishedRequest& f : *finished) {
    to_release_.push_back(f.id);
    Finish(f.id, absl::OkStatus(),
           f.reason == FinishReason::kStop ? GenerateEnd::kStop
                                           : GenerateEnd::kLength);
  }
}

void Engine::RecordDrafts(const v1::ChunkResult& cr, Live& l) {
  const int64_t k = cr.num_draft_tokens();
  if (k <= 0) return;
  const int64_t accepted = cr.new_token_ids_size() - 1;
  l.speculation.drafts += 1;
  l.speculation.draft_tokens += k;
  l.speculation.accepted_tokens += accepted;
  metrics_->spec_drafts->Increment();
  metrics_->spec_draft_tokens->Increment(static_cast<double>(k));
  metrics_->spec_accepted_tokens->Increment(static_cast<double>(accepted));
  for (int64_t j = 0;
       j < accepted && j < static_cast<int64_t>(metrics_->spec_per_pos.size());
       ++j) {
    metrics_->spec_per_pos[j]->Increment();
  }
}

absl::Status Engine::TakePromptLogprobs(Live& l, const ScheduledSequence& s,
                                        const v1::ChunkResult& result) {
  if (l.prompt_logprobs_sent || l.params.prompt_logprobs < 0) {
    return absl::OkStatus();
  }
  const auto [first, last] = MissingPromptPositions(
      static_cast<int64_t>(l.prompt_logprobs.size()), l.prompt_tokens, s);
  if (first < last) {
    if (result.positions_size() != s.num_tokens) {
      return absl::InternalError(
          absl::StrCat("the workers returned ", result.positions_size(),
                       " prompt log-probabilities for a chunk of ",
                       s.num_tokens, " tokens"));
    }
    for (int64_t p = first; p < last; ++p) {
      const v1::PositionLogprobs& lp =
          result.positions(static_cast<int>(p - s.start_position));
      TokenLogprobs entry;
      entry.token_id = l.tokens[p + 1];
      entry.logprob = lp.target_logprob();
      entry.top = TopFromProto(lp.top_ids(), lp.top_logprobs(),
                               l.params.prompt_logprobs);
      l.prompt_logprobs.push_back(std::move(entry));
    }
  }
  if (static_cast<int64_t>(l.prompt_logprobs.size()) == l.prompt_tokens) {
    l.sink->OnPromptLogprobs(l.prompt_logprobs);
    l.prompt_logprobs_sent = true;
    std::vector<TokenLogprobs>().swap(l.prompt_logprobs);
  }
  return absl::OkStatus();
}

void Engine::FailStep(const StepPlan& plan, const absl::Status& status) {
  metrics_->worker_failures->Increment();
  const bool not_run = IsStepNotRun(status);
  const bool refused = status.code() == absl::StatusCode::kInvalidArgument ||
                       status.code() == absl::StatusCode::kResourceExhausted ||
                       status.code() == absl::StatusCode::kInternal || not_run;
  if (!refused) {
    // The group is lost: every running request's worker state is gone. The
    // step is dropped and the running requests are recomputed once the
    // group is whole again (their clients see a pause, not an error).
    ready_ = false;
    LOG(ERROR) << "step " << plan.step_id << " failed, the worker group is "
               << "not ready: " << status << "; recomputing "
               << scheduler_->num_running() << " running requests later";
    RequeueRunning(status.message());
    return;
  }
  // The plan changed nothing on the workers: fail its requests only.
  LOG(ERROR) << "step " << plan.step_id << " refused: " << status;
  const absl::Status client_status =
      not_run ? absl::UnavailableError(status.message())
      : status.code() == absl::StatusCode::kResourceExhausted
          ? absl::ResourceExhaustedError(status.message())
          : absl::InternalError(status.message());
  for (const ScheduledSequence& seq : plan.sequences) {
    (void)scheduler_->Abort(seq.id);  // NotFound if it already finished.
    to_release_.push_back(seq.id);
    Finish(seq.id, client_status, GenerateEnd::kAbort);
  }
  // Close the step: every sequence of the plan is gone.
  StepResult empty;
  empty.step_id = plan.step_id;
  if (absl::StatusOr<std::vector<FinishedRequest>> f =
          scheduler_->OnStepDone(empty);
      !f.ok()) {
    LOG(ERROR) << "closing the failed step: " << f.status();
  }
}

struct Engine::Launched {
  StepPlan plan;
  // Release ids the step carried (sent again if the step fails or is void).
  std::vector<uint64_t> released;
  std::unique_ptr<WorkerGroup::PendingStep> pending;
  absl::Time start;
  // Engine::epoch_ when it was launched.
  uint64_t epoch = 0;
};

void Engine::Loop() {
  // Steps sent and not yet applied, oldest first: one, or two while the
  // next step was planned ahead.
  std::deque<Launched> flight;
  // When the last step was answered.
  absl::Time answered = absl::InfinitePast();
  for (;;) {
    if (flight.empty()) {
      bool ready;
      {
        absl::MutexLock lock(&mu_);
        last_loop_ = absl::Now();
        if (stopping_) return;
        ready = ready_;
      }
      if (!ready) {
        if (!CheckReady()) {
          absl::MutexLock lock(&mu_);
          mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                               options_.ready_poll_interval);
        }
        continue;
      }
      if (!LaunchNext(flight)) continue;
    }
    LaunchAhead(flight);
    Launched oldest = std::move(flight.front());
    flight.pop_front();
    Complete(std::move(oldest), answered);
    answered = absl::Now();
  }
}

bool Engine::LaunchNext(std::deque<Launched>& flight) {
  Launched launched;
  v1::StepRequest request;
  bool idle_check = false;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time t0 = absl::Now();
    absl::StatusOr<StepPlan> p = scheduler_->Schedule();
    if (!p.ok()) {
      LOG(ERROR) << "scheduler: " << p.status();
      return false;
    }
    metrics_->schedule->Observe(absl::ToDoubleSeconds(absl::Now() - t0));
    if (p->sequences.empty() && to_release_.empty()) {
      wake_ = false;
      mu_.AwaitWithTimeout(absl::Condition(&wake_), absl::Milliseconds(100));
      idle_check = !wake_ && absl::Now() - last_worker_check_ >
                                 options_.idle_check_interval;
      if (!idle_check) return false;
    } else {
      request = Prepare(*std::move(p), launched);
      last_worker_check_ = absl::Now();
    }
  }
  if (idle_check) {
    // Nothing to run: make sure the group is still whole, so that health
    // turns NOT_SERVING while workers restart rather than at the next
    // request.
    absl::StatusOr<std::vector<v1::GetInfoResponse>> info = workers_->Info();
    absl::MutexLock lock(&mu_);
    last_worker_check_ = absl::Now();
    if (!info.ok()) {
      ready_ = false;
      LOG(WARNING) << "a worker is gone while idle: " << info.status();
    } else if (!GroupIsWhole(*info)) {
      // A rank restarted (or its group broke) while idle: re-form.
      ready_ = false;
      LOG(WARNING) << "the worker group is not whole while idle";
    }
    return false;
  }
  Send(std::move(launched), request, flight);
  return true;
}

v1::StepRequest Engine::Prepare(StepPlan plan, Launched& launched) {
  launched.plan = std::move(plan);
  v1::StepRequest request = BuildStep(launched.plan);
  launched.released.assign(request.release_sequence_ids().begin(),
                           request.release_sequence_ids().end());
  launched.epoch = epoch_;
  return request;
}

void Engine::Send(Launched launched, const v1::StepRequest& request,
                  std::deque<Launched>& flight) {
  launched.start = absl::Now();
  launched.pending = workers_->StartStep(request);
  flight.push_back(std::move(launched));
}

void Engine::LaunchAhead(std::deque<Launched>& flight) {
  if (!options_.overlap_scheduling || !workers_->pipelined() ||
      flight.size() != 1) {
    return;
  }
  Launched launched;
  v1::StepRequest request;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || !ready_ || flight.front().epoch != epoch_) {
      return;
    }
    const absl::Time t0 = absl::Now();
    absl::StatusOr<StepPlan> p = scheduler_->ScheduleAhead();
    if (!p.ok() || p->sequences.empty()) return;
    metrics_->schedule->Observe(absl::ToDoubleSeconds(absl::Now() - t0));
    request = Prepare(*std::move(p), launched);
  }
  Send(std::move(launched), request, flight);
}

void Engine::Complete(Launched launched, absl::Time previous_end) {
  absl::StatusOr<v1::StepResponse> response = launched.pending->Wait();
  // A step sent ahead waited behind the one before it.
  metrics_->step->Observe(absl::ToDoubleSeconds(
      absl::Now() - std::max(launched.start, previous_end)));
  absl::MutexLock lock(&mu_);
  last_loop_ = absl::Now();
  const StepPlan& plan = launched.plan;
  if (launched.epoch != epoch_ || !response.ok()) {
    // The releases it carried may not have reached every rank: send them
    // again (releasing a sequence twice is harmless).
    to_release_.insert(to_release_.end(), launched.released.begin(),
                       launched.released.end());
  }
  if (launched.epoch != epoch_) {
    // Launched before the workers lost every sequence (its requests were
    // requeued already): nothing to apply.
    return;
  }
  if (plan.sequences.empty()) {
    // Only releases: nothing to apply; a lost group shows up next time.
    if (!response.ok()) ready_ = false;
    return;
  }
  // A step planned ahead of one whose requests all ended (stopped, failed,
  // aborted) has only results to ignore: ApplyResults and FailStep skip
  // requests that are gone and close the step.
  if (!response.ok()) {
    FailStep(plan, response.status());
  } else {
    ApplyResults(plan, *response);
  }
}

}  // namespace mneme::coordinator
