#include "tools/cli/cluster_command.h"

#include <sys/stat.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/host_port.h"
#include "common/status_macros.h"
#include "tools/cli/args.h"
#include "tools/cluster/daemon_binaries.h"
#include "tools/cluster/local_cluster.h"
#include "tools/synthetic/release_checkpoint.h"

namespace mneme::cli {
namespace {

absl::StatusOr<absl::Duration> GetDuration(const Args& args,
                                           const std::string& name,
                                           absl::Duration fallback) {
  if (!args.Has(name)) return fallback;
  const std::string text = args.Get(name, "");
  absl::Duration d;
  if (!absl::ParseDuration(text, &d) || d <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, "=", text,
                     " must be a positive duration such as 30s or 2m"));
  }
  return d;
}

bool IsFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The working directory: --workdir (created when missing, always kept) or
// a new temporary one (removed on a clean exit).
struct Workdir {
  std::string path;
  bool owned = false;
};

absl::StatusOr<Workdir> MakeWorkdir(const std::string& flag) {
  if (!flag.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(flag, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("--workdir ", flag, ": ", ec.message()));
    }
    return Workdir{flag, false};
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                  "/mneme-cluster.XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot create a directory like ", tmpl));
  }
  return Workdir{tmpl, true};
}

// The checkpoint to serve: --checkpoint, or the tiny model under workdir.
absl::StatusOr<std::string> ResolveCheckpoint(const std::string& flag,
                                              const std::string& workdir,
                                              std::ostream& out) {
  if (!flag.empty()) {
    if (!IsFile(flag + "/config.json")) {
      return absl::NotFoundError(absl::StrCat(
          "--checkpoint ", flag, " is not a checkpoint (no config.json)"));
    }
    return flag;
  }
  const std::string dir = workdir + "/checkpoint";
  if (IsFile(dir + "/config.json")) return dir;
  synthetic::ReleaseCheckpointOptions options;
  options.out_dir = dir;
  out << "writing the tiny model (DeepSeek-V4.1-Flash layout) to " << dir
      << "\n"
      << std::flush;
  RETURN_IF_ERROR(synthetic::MakeReleaseCheckpoint(options));
  return dir;
}

sigset_t TerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

// Takes SIGINT / SIGTERM (blocked in every thread created after the
// constructor) on its own thread with sigtimedwait and cancels the cluster.
class SignalWatcher {
 public:
  explicit SignalWatcher(cluster::LocalCluster* cluster)
      : thread_([this, cluster] {
          const sigset_t set = TerminationSignals();
          const timespec period = {0, 200'000'000};
          while (!done_.load()) {
            const int sig = sigtimedwait(&set, nullptr, &period);
            if (sig > 0) {
              signal_.store(sig);
              cluster->Cancel();
              return;
            }
          }
        }) {}
  ~SignalWatcher() {
    done_.store(true);
    thread_.join();
  }
  // The signal received, 0 if none.
  int signal() const { return signal_.load(); }

 private:
  std::atomic<bool> done_{false};
  std::atomic<int> signal_{0};
  std::thread thread_;
};

absl::Status RunUp(const std::vector<std::string>& argv, std::ostream& out,
                   std::ostream& err) {
  ASSIGN_OR_RETURN(
      Args args,
      Args::Parse(
          argv,
          {"checkpoint", "tp", "dcp", "chunk-tokens", "workdir", "bin-dir",
           "kv-cache-bytes", "max-num-seqs", "threads-per-worker", "listen",
           "comm-timeout", "ready-timeout", "coordinator-flags",
           "num-speculative-tokens", "backend"},
          {"all-metrics"}));
  if (!args.positionals().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", args.positionals()[0], "'"));
  }
  cluster::LocalClusterOptions options;
  absl::StatusOr<int64_t> tp = args.GetInt("tp", 1, 1, 64);
  absl::StatusOr<int64_t> dcp = args.GetInt("dcp", 1, 1, 64);
  absl::StatusOr<int64_t> chunk =
      args.GetInt("chunk-tokens", 8192, 1, int64_t{1} << 30);
  absl::StatusOr<int64_t> kv =
      args.GetInt("kv-cache-bytes", int64_t{256} << 20, 1, int64_t{1} << 50);
  absl::StatusOr<int64_t> seqs =
      args.GetInt("max-num-seqs", 256, 1, int64_t{1} << 30);
  absl::StatusOr<int64_t> threads =
      args.GetInt("threads-per-worker", 1, 1, 1024);
  absl::StatusOr<int64_t> spec =
      args.GetInt("num-speculative-tokens", 0, 0, 64);
  absl::StatusOr<absl::Duration> comm =
      GetDuration(args, "comm-timeout", absl::Seconds(30));
  absl::StatusOr<absl::Duration> ready =
      GetDuration(args, "ready-timeout", absl::Seconds(120));
  for (const absl::Status& s :
       {tp.status(), dcp.status(), chunk.status(), kv.status(), seqs.status(),
        threads.status(), comm.status(), ready.status(), spec.status()}) {
    if (!s.ok()) return s;
  }
  if (*dcp != 1 && *dcp != *tp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dcp=", *dcp, " must be 1 or the --tp size (", *tp, ")"));
  }
  options.backend = args.Get("backend", "cpu");
  if (options.backend != "cpu" && options.backend != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--backend ", options.backend, ": the backends are cpu and cuda"));
  }
  options.tp_size = static_cast<int>(*tp);
  options.dcp_size = static_cast<int>(*dcp);
  options.max_num_batched_tokens = *chunk;
  options.kv_cache_bytes = *kv;
  options.max_num_seqs = *seqs;
  options.threads_per_worker = static_cast<int>(*threads);
  options.num_speculative_tokens = static_cast<int>(*spec);
  options.comm_timeout = *comm;
  options.ready_timeout = *ready;
  options.coordinator_listen = args.Get("listen", "127.0.0.1:0");
  options.all_metrics = args.Has("all-metrics");
  for (absl::string_view flag : absl::StrSplit(
           args.Get("coordinator-flags", ""), ' ', absl::SkipEmpty())) {
    if (!absl::StartsWith(flag, "--")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--coordinator-flags: '", flag, "' is not a --flag=value"));
    }
    options.coordinator_flags.emplace_back(flag);
  }
  if (absl::StatusOr<HostPort> listen =
          ParseHostPort(options.coordinator_listen, "--listen");
      !listen.ok()) {
    return listen.status();
  }

  ASSIGN_OR_RETURN(
      cluster::DaemonBinaries binaries,
      cluster::FindDaemonBinaries(
          cluster::DefaultDaemonBinarySearch(args.Get("bin-dir", ""))));
  options.binaries = binaries;

  ASSIGN_OR_RETURN(Workdir workdir, MakeWorkdir(args.Get("workdir", "")));
  options.workdir = workdir.path;
  out << "workdir " << workdir.path << "\n" << std::flush;

  // Before any thread exists (writing the checkpoint starts some), so that
  // every later thread blocks them too and only the watcher takes them.
  const sigset_t signals = TerminationSignals();
  sigset_t old_mask;
  pthread_sigmask(SIG_BLOCK, &signals, &old_mask);
  // An ignored signal never reaches sigwait (a shell starts background jobs
  // with SIGINT ignored): take them back. Blocked, they cannot kill us.
  struct sigaction default_action = {}, old_int, old_term;
  default_action.sa_handler = SIG_DFL;
  sigaction(SIGINT, &default_action, &old_int);
  sigaction(SIGTERM, &default_action, &old_term);
  absl::Status status = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(
        std::string checkpoint,
        ResolveCheckpoint(args.Get("checkpoint", ""), workdir.path, out));
    options.checkpoint_dir = checkpoint;
    out << "checkpoint " << checkpoint << "\n" << std::flush;
    options.on_event = [&out](absl::string_view line) {
      out << line << "\n" << std::flush;
    };
    ASSIGN_OR_RETURN(std::unique_ptr<cluster::LocalCluster> cluster,
                     cluster::LocalCluster::Create(options));
    SignalWatcher watcher(cluster.get());
    absl::Status s = cluster->Start();
    if (s.ok()) {
      out << "coordinator at " << cluster->coordinator_address() << "\n"
          << "http at " << cluster->http_address() << "\n"
          << std::flush;
      s = cluster->Run();
    }
    if (watcher.signal() != 0) {
      err << "received " << strsignal(watcher.signal())
          << ", stopping the cluster\n";
      // Stopping on request is a clean exit, even mid-startup.
      s = absl::OkStatus();
    }
    cluster->Stop();
    return s;
  }();
  // A signal that came after the watcher stopped would kill the process
  // once unblocked: take it first.
  const timespec zero = {0, 0};
  while (sigtimedwait(&signals, nullptr, &zero) > 0) {
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  if (workdir.owned) {
    if (status.ok()) {
      std::error_code ec;
      std::filesystem::remove_all(workdir.path, ec);
    } else {
      err << "logs kept in " << workdir.path << "\n";
    }
  }
  return status;
}

}  // namespace

absl::Status RunCluster(const std::vector<std::string>& argv, std::ostream& out,
                        std::ostream& err) {
  if (argv.empty() || argv[0] != "up") {
    return absl::InvalidArgumentError(
        "expected `mneme cluster up [flags]` (mneme --help lists the flags)");
  }
  return RunUp(std::vector<std::string>(argv.begin() + 1, argv.end()), out,
               err);
}

}  // namespace mneme::cli
