#include "tools/cluster/local_cluster.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "checkpoint/model_config.h"
#include "common/grpc_channel.h"
#include "common/host_port.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "proto/grpc/health/v1/health.grpc.pb.h"

namespace mneme::cluster {
namespace {

using ::grpc::health::v1::Health;
using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;

constexpr char kAnyLocalPort[] = "127.0.0.1:0";
constexpr char kListeningPrefix[] = "listening on ";
constexpr char kMetricsPrefix[] = "metrics on ";
// Lines of a daemon's log quoted in an error.
constexpr int kTailLines = 20;
// Deadline of one health check while waiting for readiness.
constexpr absl::Duration kHealthCheckTimeout = absl::Seconds(1);

std::string Flag(absl::string_view name, absl::string_view value) {
  return absl::StrCat("--", name, "=", value);
}

std::string DurationFlag(absl::string_view name, absl::Duration value) {
  return Flag(name, absl::FormatDuration(value));
}

absl::Status CheckRange(absl::string_view field, int64_t value, int64_t lo,
                        int64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("LocalClusterOptions.", field, "=", value, " must be in [",
                     lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckPositive(absl::string_view field, absl::Duration value) {
  if (value <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("LocalClusterOptions.", field, "=",
                     absl::FormatDuration(value), " must be > 0"));
  }
  return absl::OkStatus();
}

absl::Status CheckNonNegative(absl::string_view field, absl::Duration value) {
  if (value < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("LocalClusterOptions.", field, "=",
                     absl::FormatDuration(value), " must be >= 0"));
  }
  return absl::OkStatus();
}

// Writes 32 random bytes, hex-encoded, to a new file `path` readable by its
// owner only (replacing an older one).
absl::Status WriteRandomSecret(const std::string& path) {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError("getrandom failed for the cluster secret");
    }
    got += static_cast<size_t>(n);
  }
  const std::string text =
      absl::StrCat(absl::BytesToHexString(absl::string_view(
                       reinterpret_cast<const char*>(bytes), sizeof(bytes))),
                   "\n");
  unlink(path.c_str());
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                      S_IRUSR | S_IWUSR);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create the cluster secret file ", path));
  }
  const bool written =
      write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const bool closed = close(fd) == 0;
  if (!written || !closed) {
    return absl::InternalError(
        absl::StrCat("cannot write the cluster secret file ", path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Create(
    const LocalClusterOptions& options) {
  const std::pair<const char*, const std::string*> required[] = {
      {"binaries.engram_store", &options.binaries.engram_store},
      {"binaries.worker", &options.binaries.worker},
      {"binaries.coordinator", &options.binaries.coordinator},
      {"checkpoint_dir", &options.checkpoint_dir},
      {"workdir", &options.workdir},
  };
  for (const auto& [field, value] : required) {
    if (value->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("LocalClusterOptions.", field, " is required"));
    }
  }
  struct stat st;
  if (stat(options.workdir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat("LocalClusterOptions.workdir ",
                                            options.workdir,
                                            " is not a directory"));
  }
  if (options.backend != "cpu" && options.backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("LocalClusterOptions.backend must be cpu or cuda, got '",
                     options.backend, "'"));
  }
  for (const absl::Status& s : {
           CheckRange("tp_size", options.tp_size, 1, 64),
           CheckRange("max_num_batched_tokens", options.max_num_batched_tokens,
                      1, int64_t{1} << 40),
           CheckRange("max_num_seqs", options.max_num_seqs, 1,
                      int64_t{1} << 40),
           CheckRange("kv_cache_bytes", options.kv_cache_bytes, 1,
                      int64_t{1} << 50),
           CheckRange("threads_per_worker", options.threads_per_worker, 1,
                      1024),
           CheckRange("num_speculative_tokens", options.num_speculative_tokens,
                      0, 64),
           CheckPositive("comm_timeout", options.comm_timeout),
           CheckPositive("ready_timeout", options.ready_timeout),
           CheckNonNegative("drain_timeout", options.drain_timeout),
           CheckNonNegative("stop_timeout", options.stop_timeout),
           CheckNonNegative("restart_interval", options.restart_interval),
           CheckPositive("poll_interval", options.poll_interval),
       }) {
    if (!s.ok()) return s;
  }
  if (options.dcp_size != 1 && options.dcp_size != options.tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("LocalClusterOptions.dcp_size=", options.dcp_size,
                     " must be 1 or tp_size (", options.tp_size, ")"));
  }
  if (absl::StatusOr<HostPort> listen = ParseHostPort(
          options.coordinator_listen, "LocalClusterOptions.coordinator_listen");
      !listen.ok()) {
    return listen.status();
  }
  return std::unique_ptr<LocalCluster>(new LocalCluster(options));
}

LocalCluster::~LocalCluster() { Stop(); }

void LocalCluster::Emit(absl::string_view line) const {
  if (options_.on_event) options_.on_event(line);
}

absl::Status LocalCluster::Start() {
  if (started_) {
    return absl::FailedPreconditionError("LocalCluster::Start called twice");
  }
  started_ = true;
  absl::Status status = StartOnce();
  if (!status.ok()) {
    Stop();
    return status;
  }
  start_ok_ = true;
  return absl::OkStatus();
}

absl::Status LocalCluster::StartOnce() {
  const absl::Time deadline = absl::Now() + options_.ready_timeout;
  const std::string drain =
      DurationFlag("drain_timeout", options_.drain_timeout);
  const std::string secret_file = options_.workdir + "/cluster_secret";
  RETURN_IF_ERROR(WriteRandomSecret(secret_file));
  secret_flag_ = Flag("cluster_secret_file", secret_file);

  // A checkpoint without Engram layers (V4-Flash) needs no engram store; one
  // whose config does not parse gets a store, which reports the problem.
  absl::StatusOr<std::unique_ptr<checkpoint::ModelConfig>> config =
      checkpoint::ModelConfig::Create(options_.checkpoint_dir + "/config.json");
  with_store_ = true;
  if (config.ok()) {
    const nlohmann::json* engram_layers = (*config)->Find("engram_layer_ids");
    with_store_ = engram_layers != nullptr && engram_layers->is_array() &&
                  !engram_layers->empty();
  }

  store_.name = "engram_store";
  store_.log_path = options_.workdir + "/engram_store.log";
  store_.argv = {options_.binaries.engram_store,
                 Flag("checkpoint", options_.checkpoint_dir),
                 "--io_threads=2",
                 "--worker_threads=2",
                 "--prefetch_threads=1",
                 absl::StrCat("--ram_cache_bytes=", int64_t{64} << 20),
                 secret_flag_,
                 drain};
  // Workers reach the store through shared memory (gRPC stays their
  // fallback). A Unix socket path is at most 107 bytes: under /tmp when the
  // work directory's is too long.
  shm_socket_ = options_.workdir + "/engram.sock";
  if (shm_socket_.size() > 100) {
    shm_socket_ = absl::StrCat("/tmp/mneme-engram-", getpid(), ".sock");
  }
  store_.argv.push_back(Flag("shm_socket", shm_socket_));
  store_.listen = kAnyLocalPort;
  if (options_.all_metrics) store_.metrics_listen = kAnyLocalPort;
  if (with_store_) RETURN_IF_ERROR(SpawnAndWait(store_, deadline));

  workers_.resize(options_.tp_size);
  for (int r = 0; r < options_.tp_size; ++r) {
    Daemon& w = workers_[r];
    w.name = absl::StrCat("worker ", r);
    w.log_path = absl::StrCat(options_.workdir, "/worker", r, ".log");
    w.argv = WorkerArgv(r);
    w.listen = kAnyLocalPort;
    if (options_.all_metrics) w.metrics_listen = kAnyLocalPort;
    RETURN_IF_ERROR(SpawnAndWait(w, deadline));
  }

  std::vector<std::string> addresses;
  for (const Daemon& w : workers_) addresses.push_back(w.listen);
  coordinator_.name = "coordinator";
  coordinator_.log_path = options_.workdir + "/coordinator.log";
  coordinator_.argv = {options_.binaries.coordinator,
                       Flag("workers", absl::StrJoin(addresses, ",")),
                       absl::StrCat("--max_num_batched_tokens=",
                                    options_.max_num_batched_tokens),
                       absl::StrCat("--max_num_seqs=", options_.max_num_seqs),
                       absl::StrCat("--num_speculative_tokens=",
                                    options_.num_speculative_tokens),
                       secret_flag_,
                       drain};
  coordinator_.argv.insert(coordinator_.argv.end(),
                           options_.coordinator_flags.begin(),
                           options_.coordinator_flags.end());
  // Last: replaced by the bound address for restarts.
  coordinator_.argv.push_back(Flag("http_listen", kAnyLocalPort));
  coordinator_.listen = options_.coordinator_listen;
  coordinator_.metrics_listen = kAnyLocalPort;
  RETURN_IF_ERROR(SpawnAndWait(coordinator_, deadline));
  // The HTTP front is announced after the gRPC address; a restart keeps
  // its port.
  while (true) {
    if (std::optional<std::string> http =
            coordinator_.process->FindLine("http on ");
        http.has_value()) {
      http_address_ = *http;
      coordinator_.argv.back() = Flag("http_listen", http_address_);
      break;
    }
    if (coordinator_.process->Exited()) {
      return ExitedError(coordinator_, "before starting its HTTP front");
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          "the coordinator did not start its HTTP front");
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return WaitUntilServing(deadline);
}

std::vector<std::string> LocalCluster::WorkerArgv(int rank) const {
  std::vector<std::string> argv = {
      options_.binaries.worker,
      Flag("checkpoint", options_.checkpoint_dir),
      absl::StrCat("--rank=", rank),
      absl::StrCat("--tp_size=", options_.tp_size),
      absl::StrCat("--dcp_size=", options_.dcp_size),
      absl::StrCat("--backend=", options_.backend),
      absl::StrCat("--device=", options_.backend == "cuda" ? rank : 0),
      absl::StrCat("--threads=", options_.threads_per_worker),
      absl::StrCat("--kv_cache_bytes=", options_.kv_cache_bytes),
      absl::StrCat("--num_speculative_tokens=",
                   options_.num_speculative_tokens),
      DurationFlag("comm_timeout", options_.comm_timeout),
      DurationFlag("drain_timeout", options_.drain_timeout),
      secret_flag_};
  if (with_store_) {
    argv.push_back(Flag("engram_store", store_.listen));
    argv.push_back(Flag("engram_shm_socket", shm_socket_));
  }
  // Rank 0 hosts the group's rendezvous on its own address.
  if (rank > 0) argv.push_back(Flag("group", workers_[0].listen));
  return argv;
}

absl::Status LocalCluster::Spawn(Daemon& d) {
  DaemonProcessOptions po;
  po.argv = d.argv;
  po.argv.push_back(Flag("listen", d.listen));
  po.argv.push_back(Flag("metrics_listen", d.metrics_listen));
  po.log_path = d.log_path;
  // An attempt, failed or not, counts for restart_interval.
  d.started = absl::Now();
  absl::StatusOr<std::unique_ptr<DaemonProcess>> process =
      DaemonProcess::Start(po);
  if (!process.ok()) {
    return absl::Status(process.status().code(),
                        absl::StrCat("cannot start ", d.name, ": ",
                                     process.status().message()));
  }
  d.process = *std::move(process);
  d.exit_reported = false;
  return absl::OkStatus();
}

absl::Status LocalCluster::SpawnAndWait(Daemon& d, absl::Time deadline) {
  if (cancelled_.HasBeenNotified()) {
    return absl::CancelledError("cancelled while starting the cluster");
  }
  RETURN_IF_ERROR(Spawn(d));
  while (true) {
    if (std::optional<std::string> address =
            d.process->FindLine(kListeningPrefix);
        address.has_value()) {
      d.listen = *address;
      std::string line =
          absl::StrCat(d.name, " pid ", d.process->pid(), " at ", d.listen);
      if (d.metrics_listen != "none") {
        // Printed before the gRPC address.
        d.metrics_listen =
            d.process->FindLine(kMetricsPrefix).value_or(d.metrics_listen);
        absl::StrAppend(&line, " (metrics on ", d.metrics_listen, ")");
        if (&d == &coordinator_) metrics_address_ = d.metrics_listen;
      }
      Emit(line);
      return absl::OkStatus();
    }
    if (d.process->Exited()) {
      return ExitedError(d, "before printing its address");
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          d.name, " (pid ", d.process->pid(), ") printed no '",
          kListeningPrefix, "HOST:PORT' line within ",
          absl::FormatDuration(options_.ready_timeout), "; last lines of ",
          d.log_path, ":\n", d.process->LogTail(kTailLines)));
    }
    if (cancelled_.WaitForNotificationWithTimeout(options_.poll_interval)) {
      return absl::CancelledError("cancelled while starting the cluster");
    }
  }
}

absl::Status LocalCluster::ExitedError(const Daemon& d,
                                       absl::string_view when) const {
  return absl::UnavailableError(
      absl::StrCat(d.name, " (pid ", d.process->pid(), ") ",
                   d.process->ExitDescription(), " ", when, "; last lines of ",
                   d.log_path, ":\n", d.process->LogTail(kTailLines)));
}

LocalCluster::Daemon* LocalCluster::FirstExited() {
  if (store_.process != nullptr && store_.process->Exited()) return &store_;
  for (Daemon& w : workers_) {
    if (w.process != nullptr && w.process->Exited()) return &w;
  }
  if (coordinator_.process != nullptr && coordinator_.process->Exited()) {
    return &coordinator_;
  }
  return nullptr;
}

absl::Status LocalCluster::WaitUntilServing(absl::Time deadline) {
  ASSIGN_OR_RETURN(
      std::shared_ptr<grpc::Channel> channel,
      CreateClientChannel(coordinator_.listen, ClientChannelOptions()));
  std::unique_ptr<Health::Stub> health = Health::NewStub(channel);
  std::string last = "no answer yet";
  while (true) {
    if (const Daemon* d = FirstExited(); d != nullptr) {
      return ExitedError(*d, "before the cluster was ready");
    }
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         absl::ToChronoMilliseconds(kHealthCheckTimeout));
    HealthCheckResponse response;
    const grpc::Status status =
        health->Check(&context, HealthCheckRequest(), &response);
    if (status.ok() && response.status() == HealthCheckResponse::SERVING) {
      return absl::OkStatus();
    }
    last = status.ok()
               ? HealthCheckResponse::ServingStatus_Name(response.status())
               : absl::StrCat("error ", status.error_code(), ": ",
                              status.error_message());
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the cluster was not ready within ",
          absl::FormatDuration(options_.ready_timeout), ": the coordinator at ",
          coordinator_.listen, " answers health checks with ", last,
          "; last lines of ", coordinator_.log_path, ":\n",
          coordinator_.process->LogTail(kTailLines)));
    }
    if (cancelled_.WaitForNotificationWithTimeout(options_.poll_interval)) {
      return absl::CancelledError("cancelled while starting the cluster");
    }
  }
}

absl::Status LocalCluster::Run() {
  if (!start_ok_ || stopped_) {
    return absl::FailedPreconditionError(
        "LocalCluster::Run needs a successful Start() and no Stop()");
  }
  while (!cancelled_.WaitForNotificationWithTimeout(options_.poll_interval)) {
    Supervise();
  }
  return absl::OkStatus();
}

void LocalCluster::Supervise() {
  for (Daemon* d : {&store_, &coordinator_}) {
    if (d->process == nullptr) continue;
    if (d->process->Exited() && !d->exit_reported) {
      d->exit_reported = true;
      Emit(absl::StrCat(d->name, " pid ", d->process->pid(), " ",
                        d->process->ExitDescription()));
    }
  }
  for (Daemon& w : workers_) {
    if (!w.process->Exited() || w.exit_reported) continue;
    w.exit_reported = true;
    Emit(absl::StrCat(w.name, " pid ", w.process->pid(), " ",
                      w.process->ExitDescription()));
  }

  const absl::Duration interval = options_.restart_interval;
  if (store_.process != nullptr && store_.process->Exited() &&
      absl::Now() - store_.started >= interval) {
    // The workers keep their weights: their lookups fail until the store is
    // back (only the requests of those steps fail).
    Emit(absl::StrCat("restarting ", store_.name, " on ", store_.listen));
    if (absl::Status s = Spawn(store_); s.ok()) {
      Emit(absl::StrCat(store_.name, " pid ", store_.process->pid(), " at ",
                        store_.listen));
    } else {
      Emit(s.message());
    }
  }
  // A worker that exits is restarted alone: the coordinator re-forms the
  // group with it, and the other ranks keep their weights.
  for (Daemon& w : workers_) {
    if (!w.process->Exited() || absl::Now() - w.started < interval ||
        cancelled_.HasBeenNotified()) {
      continue;
    }
    Emit(absl::StrCat("restarting ", w.name, " on ", w.listen));
    if (absl::Status s = Spawn(w); s.ok()) {
      Emit(absl::StrCat(w.name, " pid ", w.process->pid(), " at ", w.listen));
    } else {
      // Still counts as down: retried after restart_interval.
      Emit(s.message());
    }
  }
  if (coordinator_.process->Exited() &&
      absl::Now() - coordinator_.started >= interval) {
    Emit(absl::StrCat("restarting ", coordinator_.name, " on ",
                      coordinator_.listen));
    if (absl::Status s = Spawn(coordinator_); s.ok()) {
      Emit(absl::StrCat(coordinator_.name, " pid ", coordinator_.process->pid(),
                        " at ", coordinator_.listen, " (metrics on ",
                        coordinator_.metrics_listen, ")"));
    } else {
      Emit(s.message());
    }
  }
}

void LocalCluster::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (coordinator_.process != nullptr) {
    coordinator_.process->Stop(options_.stop_timeout);
  }
  for (Daemon& w : workers_) {
    if (w.process != nullptr) w.process->Signal(SIGTERM);
  }
  for (Daemon& w : workers_) {
    if (w.process != nullptr) w.process->Stop(options_.stop_timeout);
  }
  if (store_.process != nullptr) store_.process->Stop(options_.stop_timeout);
}

std::vector<LocalCluster::DaemonInfo> LocalCluster::daemons() const {
  std::vector<DaemonInfo> out;
  std::vector<const Daemon*> all = {&store_};
  for (const Daemon& w : workers_) all.push_back(&w);
  all.push_back(&coordinator_);
  for (const Daemon* d : all) {
    if (d->process == nullptr) continue;
    out.push_back({d->name, d->process->pid(), d->listen, d->log_path});
  }
  return out;
}

const std::string& LocalCluster::coordinator_address() const {
  return coordinator_.listen;
}

}  // namespace mneme::cluster
