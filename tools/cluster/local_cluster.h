#ifndef MNEME_TOOLS_CLUSTER_LOCAL_CLUSTER_H_
#define MNEME_TOOLS_CLUSTER_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "tools/cluster/daemon_binaries.h"
#include "tools/cluster/daemon_process.h"

namespace mneme::cluster {

struct LocalClusterOptions {
  // The daemons' executables (FindDaemonBinaries). Required.
  DaemonBinaries binaries;
  // The model checkpoint every daemon loads. Required.
  std::string checkpoint_dir;
  // An existing directory for the daemons' logs: engram_store.log,
  // worker<R>.log, coordinator.log (appended to across restarts), and the
  // cluster secret: Start() writes a fresh random one to
  // workdir/cluster_secret (mode 0600) and passes it to every daemon
  // (--cluster_secret_file), so their internal services refuse callers
  // without it. Required.
  std::string workdir;
  // Tensor-parallel workers; in [1, 64]. Default: 1.
  int tp_size = 1;
  // Decode context parallelism of the workers: 1 (off) or tp_size.
  // Default: 1.
  int dcp_size = 1;
  // The coordinator's token budget per step (the prefill chunk size);
  // >= 1. Default: 8192.
  int64_t max_num_batched_tokens = 8192;
  // The coordinator's most running requests; >= 1. Default: 256.
  int64_t max_num_seqs = 256;
  // KV cache budget of each worker, bytes; >= 1. Default: 256 MiB (256
  // sequences of the tiny V4-Flash model reserve 78 MiB of fixed state).
  int64_t kv_cache_bytes = int64_t{256} << 20;
  // The workers' backend: "cpu", or "cuda" (worker R on CUDA device R,
  // NCCL between them; the workers must be built with --config=cuda).
  // Default: "cpu".
  std::string backend = "cpu";
  // CPU backend threads of each worker; in [1, 1024]. Default: 1.
  int threads_per_worker = 1;
  // DSpark speculative decoding: drafts per decode step, for the workers
  // and the coordinator (the checkpoint needs DSpark stages); in [0, 64].
  // Default: 0 (off).
  int num_speculative_tokens = 0;
  // The store and the workers serve metrics too (on free ports, printed
  // with their addresses); the coordinator always does. Default: false.
  bool all_metrics = false;
  // More flags for the coordinator (e.g. "--max_queued_requests=4").
  // Default: none.
  std::vector<std::string> coordinator_flags;
  // The coordinator's gRPC address, HOST:PORT (port 0 picks a free one).
  // The other daemons always listen on 127.0.0.1 with free ports.
  // Default: "127.0.0.1:0".
  std::string coordinator_listen = "127.0.0.1:0";
  // The workers' limit of joining their group and of each collective (how
  // long survivors of a dead peer take to notice); > 0. Default: 30 s.
  absl::Duration comm_timeout = absl::Seconds(30);
  // How long Start() waits for the coordinator to be SERVING; > 0.
  // Default: 120 s.
  absl::Duration ready_timeout = absl::Seconds(120);
  // The daemons' --drain_timeout (in-flight RPCs on SIGTERM); >= 0.
  // Default: 5 s.
  absl::Duration drain_timeout = absl::Seconds(5);
  // How long a daemon may take to exit after SIGTERM before it is
  // SIGKILLed; >= 0. Default: 10 s.
  absl::Duration stop_timeout = absl::Seconds(10);
  // Least time between two starts of the same daemon (of the worker group
  // for workers) while supervising; >= 0. Default: 1 s.
  absl::Duration restart_interval = absl::Seconds(1);
  // How often Start() and Run() look at the daemons; > 0. Default: 100 ms.
  absl::Duration poll_interval = absl::Milliseconds(100);
  // Receives one line per event, on the thread calling Start() / Run() /
  // Stop(): "<daemon> pid <P> at <HOST:PORT>" when a daemon starts (daemon
  // "engram_store", "worker <R>" or "coordinator"), "<daemon> pid <P>
  // <how it ended>" when one exits unexpectedly, "restarting ..." when it is
  // replaced. May call Cancel(). Default: none.
  std::function<void(absl::string_view line)> on_event;
};

// A whole Mneme cluster on this machine, as child processes: one engram
// store, tp_size workers (rank 0 first; its address is the group's
// rendezvous) and the coordinator, all on 127.0.0.1 (the coordinator on
// coordinator_listen) with ports picked by the kernel.
//
// Call order: Create() -> Start() -> Run() (until Cancel()) -> Stop().
// Start(), Run() and Stop() must be called from one long-lived thread: the
// children are SIGKILLed when it exits. Cancel() may be called from any
// thread; nothing else is thread-safe. The cluster owns its children; the
// destructor stops them.
//
// Supervision (Run): a daemon that exits is restarted alone, on the same
// ports and flags, at most once per restart_interval, as systemd or
// Kubernetes would. A restarted worker loads its shard and the coordinator
// re-forms the group with it (a new group generation; the other ranks keep
// their weights); the workers ride out an engram store restart (the steps
// whose lookups fail fail alone); a restarted coordinator finds the group
// whole.
class LocalCluster {
 public:
  // A running (or last run) daemon.
  struct DaemonInfo {
    // "engram_store", "worker <R>" or "coordinator".
    std::string name;
    pid_t pid = -1;
    // Its gRPC address, HOST:PORT.
    std::string address;
    std::string log_path;
  };

  // InvalidArgument naming the field for bad options; NotFound for a
  // workdir that is not a directory.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Create(
      const LocalClusterOptions& options);

  ~LocalCluster();

  // Starts the store, the workers and the coordinator, each after the one
  // before it printed its address, and waits until the coordinator's
  // grpc.health.v1 status is SERVING. Errors (after which nothing is left
  // running): Unavailable naming a daemon that exited, with the last lines
  // of its log; the exec's code (NotFound, PermissionDenied) naming a daemon
  // that could not be started; DeadlineExceeded when the cluster is not
  // ready within ready_timeout (with the coordinator's last answer and its
  // log); Cancelled after Cancel(); FailedPrecondition when called twice.
  absl::Status Start();

  // Supervises the daemons (see the class comment) until Cancel(). Returns
  // at once when Cancel() came first. FailedPrecondition unless Start()
  // succeeded.
  absl::Status Run();

  // Makes Start() and Run() return soon. Thread-safe; idempotent.
  void Cancel() { cancelled_.Notify(); }

  // SIGTERM to the coordinator, then the workers, then the store, waiting
  // for each (SIGKILL after stop_timeout). Idempotent.
  void Stop();

  // The daemons started so far: store, workers in rank order, coordinator.
  std::vector<DaemonInfo> daemons() const;
  // The coordinator's gRPC address (after Start()).
  const std::string& coordinator_address() const;
  // Its HTTP /metrics address (after Start()).
  // The coordinator's OpenAI-compatible HTTP front, HOST:PORT.
  const std::string& http_address() const { return http_address_; }
  const std::string& coordinator_metrics_address() const {
    return metrics_address_;
  }

 private:
  // One daemon: how to start it again, and its current process.
  struct Daemon {
    std::string name;
    std::string log_path;
    // Everything but --listen and --metrics_listen.
    std::vector<std::string> argv;
    // "127.0.0.1:0" until the first start printed its address, then that
    // address (restarts reuse it: the other daemons know it).
    std::string listen;
    // "none", or like `listen` for the coordinator's metrics endpoint.
    std::string metrics_listen = "none";
    std::unique_ptr<DaemonProcess> process;
    // The last attempt to start it.
    absl::Time started = absl::InfinitePast();
    // Whether its exit was reported.
    bool exit_reported = false;
  };

  explicit LocalCluster(const LocalClusterOptions& options)
      : options_(options) {}

  void Emit(absl::string_view line) const;
  absl::Status StartOnce();
  // Starts `d`'s process and records its start (not waiting for it).
  absl::Status Spawn(Daemon& d);
  // Spawn, then wait until it printed its address(es).
  absl::Status SpawnAndWait(Daemon& d, absl::Time deadline);
  // Unavailable naming `d`, how it ended and its log's tail.
  absl::Status ExitedError(const Daemon& d, absl::string_view when) const;
  // The first started daemon that has exited, or nullptr.
  Daemon* FirstExited();
  absl::Status WaitUntilServing(absl::Time deadline);
  // One supervision pass.
  void Supervise();
  std::vector<std::string> WorkerArgv(int rank) const;

  const LocalClusterOptions options_;
  absl::Notification cancelled_;
  bool started_ = false;
  bool start_ok_ = false;
  // Whether the checkpoint has Engram layers (then an engram store runs).
  bool with_store_ = true;
  bool stopped_ = false;
  Daemon store_;
  std::vector<Daemon> workers_;
  Daemon coordinator_;
  std::string metrics_address_;
  std::string http_address_;
  // --cluster_secret_file=workdir/cluster_secret, set by StartOnce().
  std::string secret_flag_;
  // The store's shared-memory socket.
  std::string shm_socket_;
};

}  // namespace mneme::cluster

#endif  // MNEME_TOOLS_CLUSTER_LOCAL_CLUSTER_H_
