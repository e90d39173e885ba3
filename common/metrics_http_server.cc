#include "common/metrics_http_server.h"

#include <glog/logging.h>
#include <httplib.h>
#include <netdb.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"

namespace mneme {
namespace {

// httplib's own pool queues without limit; this one makes the accept loop
// wait once `max_queued` connections are waiting for a thread.
class BoundedThreadPool final : public httplib::TaskQueue {
 public:
  BoundedThreadPool(int num_threads, int max_queued) : max_queued_(max_queued) {
    threads_.reserve(num_threads);
    for (int i = 0; i < num_threads; ++i) {
      threads_.emplace_back([this] { Work(); });
    }
  }

  ~BoundedThreadPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &BoundedThreadPool::HasRoom));
    queue_.push_back(std::move(fn));
  }

  // Runs what is queued, then joins the threads. Idempotent.
  void shutdown() override {
    {
      absl::MutexLock lock(&mu_);
      shutting_down_ = true;
    }
    for (std::thread& thread : threads_) {
      if (thread.joinable()) thread.join();
    }
  }

 private:
  bool HasRoom() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return queue_.size() < static_cast<size_t>(max_queued_);
  }
  bool HasWorkOrShuttingDown() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() || shutting_down_;
  }

  void Work() {
    for (;;) {
      std::function<void()> fn;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(
            absl::Condition(this, &BoundedThreadPool::HasWorkOrShuttingDown));
        if (queue_.empty()) return;
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }

  const int max_queued_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

absl::Status CheckRange(absl::string_view field, int value, int min, int max) {
  if (value < min || value > max) {
    return absl::InvalidArgumentError(absl::StrCat("MetricsHttpServerOptions.",
                                                   field, " must be in ", min,
                                                   "..", max, ", got ", value));
  }
  return absl::OkStatus();
}

absl::Status ValidateOptions(const MetricsHttpServerOptions& options) {
  if (options.host.empty()) {
    return absl::InvalidArgumentError(
        "MetricsHttpServerOptions.host must not be empty");
  }
  for (const absl::Status& status :
       {CheckRange("port", options.port, 0, 65535),
        CheckRange("num_threads", options.num_threads, 1, 64),
        CheckRange("max_queued_connections", options.max_queued_connections, 1,
                   4096),
        CheckRange("io_timeout_seconds", options.io_timeout_seconds, 1,
                   3600)}) {
    RETURN_IF_ERROR(status);
  }
  return absl::OkStatus();
}

// "host:port", "[v6]:port".
std::string AddressText(absl::string_view host, int port) {
  if (host.find(':') != absl::string_view::npos) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

// Resolves `host` the way httplib will, to report a bad host clearly.
absl::Status CheckResolvable(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for metrics on ",
                                               AddressText(host, port), ": ",
                                               gai_strerror(rc)));
  }
  freeaddrinfo(result);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Create(
    const MetricsHttpServerOptions& options, const MetricsRegistry* registry,
    ReadinessCallback ready) {
  RETURN_IF_ERROR(ValidateOptions(options));
  if (registry == nullptr) {
    return absl::InvalidArgumentError("MetricsHttpServer: registry is null");
  }
  if (!ready) {
    return absl::InvalidArgumentError(
        "MetricsHttpServer: readiness callback is empty");
  }
  if (absl::Status status = CheckResolvable(options.host, options.port);
      !status.ok()) {
    return status;
  }

  auto server = std::make_unique<httplib::Server>();
  const int num_threads = options.num_threads;
  const int max_queued = options.max_queued_connections;
  server->new_task_queue = [num_threads, max_queued] {
    return new BoundedThreadPool(num_threads, max_queued);
  };
  // httplib's default also sets SO_REUSEPORT, which would let a second
  // server bind a port already in use and silently share it.
  server->set_socket_options([](socket_t sock) {
    const int one = 1;
    // Best effort: without it a restart may wait for TIME_WAIT to pass.
    (void)setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  });
  server->set_read_timeout(options.io_timeout_seconds, 0);
  server->set_write_timeout(options.io_timeout_seconds, 0);
  server->set_keep_alive_timeout(options.io_timeout_seconds);

  server->Get("/metrics", [registry](const httplib::Request& /*request*/,
                                     httplib::Response& response) {
    response.set_content(registry->ExportText(),
                         std::string(kPrometheusTextContentType));
  });
  server->Get("/healthz", [](const httplib::Request& /*request*/,
                             httplib::Response& response) {
    response.set_content("ok", "text/plain; charset=utf-8");
  });
  server->Get(
      "/readyz", [ready = std::move(ready)](const httplib::Request& /*request*/,
                                            httplib::Response& response) {
        if (ready()) {
          response.set_content("ready", "text/plain; charset=utf-8");
        } else {
          response.status = 503;
          response.set_content("not ready", "text/plain; charset=utf-8");
        }
      });

  // httplib reports only success; errno still holds the reason of the
  // failed bind() or listen().
  errno = 0;
  int port = options.port;
  bool bound;
  if (options.port == 0) {
    port = server->bind_to_any_port(options.host);
    bound = port > 0;
  } else {
    bound = server->bind_to_port(options.host, options.port);
  }
  if (!bound) {
    const int error = errno;
    return absl::UnavailableError(
        absl::StrCat("cannot listen for metrics on ",
                     AddressText(options.host, options.port), ": ",
                     error != 0 ? std::strerror(error) : "bind failed"));
  }

  auto metrics_server = std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(std::move(server), port));
  metrics_server->Start();
  LOG(INFO) << "Serving /metrics, /healthz and /readyz on "
            << AddressText(options.host, port);
  return metrics_server;
}

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<httplib::Server> server,
                                     int port)
    : server_(std::move(server)), port_(port) {}

void MetricsHttpServer::Start() {
  absl::MutexLock lock(&mu_);
  thread_ = std::thread([this] {
    if (!server_->listen_after_bind()) {
      LOG(ERROR) << "metrics HTTP server stopped accepting connections";
    }
    listen_returned_.store(true);
  });
  // httplib's stop() is a no-op until the accept loop runs; wait for it so a
  // Stop() right after Create() cannot be lost.
  while (!server_->is_running() && !listen_returned_.load()) {
    absl::SleepFor(absl::Milliseconds(1));
  }
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  absl::MutexLock lock(&mu_);
  if (!thread_.joinable()) return;
  server_->stop();
  thread_.join();
}

}  // namespace mneme
