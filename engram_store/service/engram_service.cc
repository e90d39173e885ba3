#include "engram_store/service/engram_service.h"

#include <grpcpp/support/time.h>

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"

namespace mneme::engram {

struct EngramService::Metrics {
  CounterFamily* rpcs = nullptr;
  CounterFamily* rows = nullptr;
  HistogramFamily* seconds = nullptr;
};

namespace {

const grpc::Status kDraining(grpc::StatusCode::UNAVAILABLE,
                             "server is draining");
const grpc::Status kBusy(grpc::StatusCode::RESOURCE_EXHAUSTED,
                         "the engram store's work queue is full; retry later");

}  // namespace

absl::StatusOr<std::unique_ptr<EngramService>> EngramService::Create(
    const EngramServiceOptions& options, EngramStore* store, InflightGate* gate,
    MetricsRegistry* metrics) {
  const RequestLimits& l = options.limits;
  if (l.max_rows_per_request < 1) {
    return absl::InvalidArgumentError(
        "limits.max_rows_per_request must be >= 1");
  }
  if (l.max_rows_per_stream < 1) {
    return absl::InvalidArgumentError(
        "limits.max_rows_per_stream must be >= 1");
  }
  if (l.max_stream_message_bytes < 1) {
    return absl::InvalidArgumentError(
        "limits.max_stream_message_bytes must be >= 1");
  }
  if (l.max_response_bytes < 1) {
    return absl::InvalidArgumentError("limits.max_response_bytes must be >= 1");
  }
  if (options.default_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("default_timeout must be positive");
  }
  if (store == nullptr || gate == nullptr) {
    return absl::InvalidArgumentError("store and gate are required");
  }
  absl::StatusOr<std::unique_ptr<WorkPool>> pool =
      WorkPool::Create(options.worker_threads, options.max_queued_tasks);
  if (!pool.ok()) {
    return absl::InvalidArgumentError(
        "worker_threads and max_queued_tasks must be >= 1");
  }
  std::unique_ptr<EngramService> service(
      new EngramService(options, store, gate));
  service->pool_ = *std::move(pool);
  service->metrics_ = std::make_unique<Metrics>();
  if (metrics != nullptr) {
    ASSIGN_OR_RETURN(
        CounterFamily * rpcs,
        metrics->AddCounter(
            {.name = "mneme_engram_rpcs_total",
             .help = "Engram store RPCs by method and status code.",
             .label_names = {"method", "code"}}));
    ASSIGN_OR_RETURN(
        CounterFamily * rows,
        metrics->AddCounter(
            {.name = "mneme_engram_rpc_rows_total",
             .help = "Rows returned or queued by Engram store RPCs.",
             .label_names = {"method"}}));
    static constexpr double kBounds[] = {1e-4, 2.5e-4, 5e-4,   1e-3, 2.5e-3,
                                         5e-3, 1e-2,   2.5e-2, 5e-2, 0.1,
                                         0.25, 0.5,    1,      2.5,  10};
    ASSIGN_OR_RETURN(
        HistogramFamily * seconds,
        metrics->AddHistogram({.name = "mneme_engram_rpc_seconds",
                               .help = "Engram store RPC latency by method.",
                               .label_names = {"method"}},
                              kBounds));
    service->metrics_->rpcs = rpcs;
    service->metrics_->rows = rows;
    service->metrics_->seconds = seconds;
  }
  return service;
}

EngramService::EngramService(const EngramServiceOptions& options,
                             EngramStore* store, InflightGate* gate)
    : options_(options), handler_(store, options.limits), gate_(gate) {}

EngramService::~EngramService() = default;

absl::Time EngramService::Deadline(
    const grpc::CallbackServerContext& context) const {
  const absl::Time fallback = absl::Now() + options_.default_timeout;
  const auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) {
    return fallback;
  }
  return std::min(fallback, absl::FromChrono(deadline));
}

void EngramService::Record(const char* method, const absl::Status& status,
                           size_t rows, absl::Time start) const {
  if (metrics_->rpcs == nullptr) return;
  const std::string code = absl::StatusCodeToString(status.code());
  if (absl::StatusOr<Counter*> c = metrics_->rpcs->Get({method, code});
      c.ok()) {
    (*c)->Increment();
  }
  if (absl::StatusOr<Counter*> c = metrics_->rows->Get({method}); c.ok()) {
    (*c)->Increment(static_cast<double>(rows));
  }
  if (absl::StatusOr<Histogram*> h = metrics_->seconds->Get({method}); h.ok()) {
    (*h)->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  }
}

template <typename Work>
grpc::ServerUnaryReactor* EngramService::Unary(
    grpc::CallbackServerContext* context, const char* method, RunOn run_on,
    Work work) {
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
  const absl::Time start = absl::Now();
  auto run = [this, reactor, method, start, work = std::move(work),
              pass = std::move(*pass)]() mutable {
    const Outcome outcome = work();
    Record(method, outcome.status, outcome.rows, start);
    reactor->Finish(ToGrpcStatus(outcome.status));
  };
  if (run_on == RunOn::kInline) {
    run();
  } else if (!pool_->TrySchedule(std::move(run))) {
    Record(method, absl::ResourceExhaustedError(""), 0, start);
    reactor->Finish(kBusy);
  }
  return reactor;
}

grpc::ServerUnaryReactor* EngramService::Lookup(
    grpc::CallbackServerContext* context, const v1::LookupRequest* request,
    v1::LookupResponse* response) {
  return Unary(
      context, "Lookup", RunOn::kPool,
      [this, request, response, deadline = Deadline(*context)] {
        const absl::Status s = handler_.Lookup(*request, deadline, response);
        return Outcome{s, static_cast<size_t>(response->row_ids_size())};
      });
}

// Streams the rows of one request in bounded messages: each message's rows
// are read on the pool, written, and the next message is scheduled from
// OnWriteDone. Deletes itself in OnDone.
class EngramService::StreamReactor final
    : public grpc::ServerWriteReactor<v1::LookupResponse> {
 public:
  StreamReactor(EngramService* service, const v1::LookupRequest* request,
                absl::Time deadline, InflightGate::Pass pass)
      : service_(service),
        request_(request),
        deadline_(deadline),
        start_(absl::Now()),
        pass_(std::move(pass)) {}

  void Start() {
    if (!service_->pool_->TrySchedule([this] { Resolve(); })) {
      Done(absl::ResourceExhaustedError(
          "the engram store's work queue is full; retry later"));
    }
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Done(absl::CancelledError("the stream was cancelled"));
      return;
    }
    if (next_ >= resolved_.row_ids.size()) {
      Done(absl::OkStatus());
      return;
    }
    if (!service_->pool_->TrySchedule([this] { ReadNext(); })) {
      Done(absl::ResourceExhaustedError(
          "the engram store's work queue is full; retry later"));
    }
  }

  void OnDone() override { delete this; }

 private:
  void Resolve() {
    absl::StatusOr<ResolvedRequest> resolved = service_->handler_.ResolveLookup(
        *request_, service_->handler_.limits().max_rows_per_stream);
    if (!resolved.ok()) {
      Done(resolved.status());
      return;
    }
    resolved_ = *std::move(resolved);
    per_message_ = service_->handler_.RowsPerStreamMessage(resolved_);
    ReadNext();
  }

  void ReadNext() {
    const size_t count =
        std::min(per_message_, resolved_.row_ids.size() - next_);
    message_.Clear();
    const absl::Status s = service_->handler_.LookupRows(
        resolved_, next_, count, deadline_, &message_);
    if (!s.ok()) {
      Done(s);
      return;
    }
    next_ += count;
    StartWrite(&message_);
  }

  void Done(const absl::Status& status) {
    service_->Record("LookupStream", status, next_, start_);
    Finish(ToGrpcStatus(status));
  }

  EngramService* const service_;
  const v1::LookupRequest* const request_;
  const absl::Time deadline_;
  const absl::Time start_;
  InflightGate::Pass pass_;
  ResolvedRequest resolved_;
  size_t per_message_ = 1;
  size_t next_ = 0;
  v1::LookupResponse message_;
};

grpc::ServerWriteReactor<v1::LookupResponse>* EngramService::LookupStream(
    grpc::CallbackServerContext* context, const v1::LookupRequest* request) {
  // A reactor that only finishes.
  class Refused final : public grpc::ServerWriteReactor<v1::LookupResponse> {
   public:
    explicit Refused(const grpc::Status& status) { Finish(status); }
    void OnDone() override { delete this; }
  };
  if (absl::Status st = gate_->Authenticate(*context); !st.ok()) {
    return new Refused(ToGrpcStatus(st));
  }
  std::optional<InflightGate::Pass> pass = gate_->Enter();
  if (!pass.has_value()) {
    return new Refused(kDraining);
  }
  auto* reactor =
      new StreamReactor(this, request, Deadline(*context), std::move(*pass));
  reactor->Start();
  return reactor;
}

grpc::ServerUnaryReactor* EngramService::Prefetch(
    grpc::CallbackServerContext* context, const v1::PrefetchRequest* request,
    v1::PrefetchResponse* response) {
  // Prefetch only queues rows for the store's background reads.
  return Unary(context, "Prefetch", RunOn::kInline, [this, request, response] {
    const absl::Status s = handler_.Prefetch(*request, response);
    return Outcome{s, static_cast<size_t>(response->rows_queued())};
  });
}

grpc::ServerUnaryReactor* EngramService::Describe(
    grpc::CallbackServerContext* context,
    const v1::DescribeRequest* /*request: has no fields*/,
    v1::DescribeResponse* response) {
  return Unary(context, "Describe", RunOn::kInline, [this, response] {
    handler_.Describe(response);
    return Outcome{absl::OkStatus(), 0};
  });
}

}  // namespace mneme::engram
