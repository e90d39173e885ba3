#include "engram_store/service/shm_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "engram_store/shm/shm_wire.h"
#include "formats/row_format.h"
#include "glog/logging.h"

namespace mneme::engram {
namespace {

using shm::Call;
using shm::Op;
using shm::Reply;

const char* MethodName(Op op) {
  switch (op) {
    case Op::kLookup:
      return "Lookup";
    case Op::kLookupStream:
      return "LookupStream";
    case Op::kPrefetch:
      return "Prefetch";
    case Op::kDescribe:
      return "Describe";
    case Op::kContinue:
      break;
  }
  return "?";
}

// The most bytes of an area: the mapping of each connection is this large at
// most (address space; pages are touched as used).
constexpr uint64_t kMaxAreaBytes = uint64_t{1} << 34;

}  // namespace

struct ShmEngramServer::Metrics {
  CounterFamily* calls = nullptr;
  CounterFamily* rows = nullptr;
  HistogramFamily* seconds = nullptr;
};

struct ShmEngramServer::Connection {
  int fd = -1;
  std::thread thread;
  std::atomic<bool> done = false;
};

absl::StatusOr<std::unique_ptr<ShmEngramServer>> ShmEngramServer::Create(
    const ShmServerOptions& options, const RequestHandler* handler,
    InflightGate* gate, MetricsRegistry* metrics) {
  if (handler == nullptr || gate == nullptr) {
    return absl::InvalidArgumentError(
        "a request handler and a gate are needed");
  }
  sockaddr_un addr{};
  if (options.socket_path.empty() ||
      options.socket_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ShmServerOptions.socket_path must be 1 to ", sizeof(addr.sun_path) - 1,
        " bytes, got '", options.socket_path, "'"));
  }
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ShmServerOptions.max_connections must be >= 1, got ",
                     options.max_connections));
  }
  if (options.request_bytes < 4096 || options.request_bytes > kMaxAreaBytes ||
      options.response_bytes < 4096 || options.response_bytes > kMaxAreaBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ShmServerOptions request_bytes and response_bytes must be in [4096, ",
        kMaxAreaBytes, "], got ", options.request_bytes, " and ",
        options.response_bytes));
  }
  if (options.default_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "ShmServerOptions.default_timeout must be > 0");
  }
  if (options.spin < absl::ZeroDuration() ||
      options.spin > absl::Milliseconds(10)) {
    // A spinning thread does not see the socket (a client gone, Shutdown).
    return absl::InvalidArgumentError(
        absl::StrCat("ShmServerOptions.spin must be in [0, 10ms], got ",
                     absl::FormatDuration(options.spin)));
  }
  if (options.socket_mode < 0 || options.socket_mode > 0777) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ShmServerOptions.socket_mode must be permission bits, got ",
        options.socket_mode));
  }
  std::unique_ptr<ShmEngramServer> server(
      new ShmEngramServer(options, handler, gate));
  server->metrics_ = std::make_unique<Metrics>();
  if (metrics != nullptr) {
    ASSIGN_OR_RETURN(
        server->metrics_->calls,
        metrics->AddCounter({.name = "mneme_engram_shm_calls_total",
                             .help = "Engram store calls over shared memory "
                                     "by method and status code.",
                             .label_names = {"method", "code"}}));
    ASSIGN_OR_RETURN(
        server->metrics_->rows,
        metrics->AddCounter({.name = "mneme_engram_shm_rows_total",
                             .help = "Rows returned or queued by Engram store "
                                     "calls over shared memory.",
                             .label_names = {"method"}}));
    static constexpr double kBounds[] = {1e-5,   2.5e-5, 5e-5,   1e-4, 2.5e-4,
                                         5e-4,   1e-3,   2.5e-3, 5e-3, 1e-2,
                                         2.5e-2, 0.1,    1,      10};
    ASSIGN_OR_RETURN(
        server->metrics_->seconds,
        metrics->AddHistogram(
            {.name = "mneme_engram_shm_call_seconds",
             .help = "Engram store call latency over shared memory.",
             .label_names = {"method"}},
            kBounds));
  }

  // A socket file left by a previous run is replaced; anything else stays.
  struct stat st {};
  if (lstat(options.socket_path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(options.socket_path, " exists and is not a socket"));
    }
    unlink(options.socket_path.c_str());
  }
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("socket(AF_UNIX): ", std::strerror(errno)));
  }
  server->listen_fd_ = fd;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, options.socket_path.data(),
              options.socket_path.size());
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("binding the shared-memory socket ", options.socket_path,
                     ": ", std::strerror(errno)));
  }
  if (chmod(options.socket_path.c_str(),
            static_cast<mode_t>(options.socket_mode)) != 0 ||
      listen(fd, 64) != 0) {
    return absl::InternalError(absl::StrCat(
        "listening on ", options.socket_path, ": ", std::strerror(errno)));
  }
  if (pipe2(server->wake_fds_, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

ShmEngramServer::ShmEngramServer(const ShmServerOptions& options,
                                 const RequestHandler* handler,
                                 InflightGate* gate)
    : options_(options), handler_(handler), gate_(gate) {}

ShmEngramServer::~ShmEngramServer() {
  Shutdown();
  for (int& fd : wake_fds_) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
}

void ShmEngramServer::Shutdown() {
  std::vector<std::unique_ptr<Connection>> connections;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    // Wakes every connection's wait; the threads then close their sockets.
    for (const auto& c : connections_) shutdown(c->fd, SHUT_RDWR);
  }
  if (wake_fds_[1] >= 0) {
    const char byte = 1;
    ssize_t ignored = write(wake_fds_[1], &byte, 1);
    (void)ignored;
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  {
    absl::MutexLock lock(&mu_);
    connections.swap(connections_);
  }
  for (const auto& c : connections) {
    if (c->thread.joinable()) c->thread.join();
    close(c->fd);
  }
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    listen_fd_ = -1;
    unlink(options_.socket_path.c_str());
  }
}

int ShmEngramServer::connections() const {
  absl::MutexLock lock(&mu_);
  int open = 0;
  for (const auto& c : connections_) open += c->done.load() ? 0 : 1;
  return open;
}

void ShmEngramServer::AcceptLoop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fds_[0], POLLIN, 0}};
    const int ready = poll(fds, 2, -1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0 || (fds[1].revents & POLLIN) != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    absl::MutexLock lock(&mu_);
    if (shut_down_) {
      close(fd);
      return;
    }
    // Reap finished connections.
    for (auto it = connections_.begin(); it != connections_.end();) {
      if ((*it)->done.load()) {
        (*it)->thread.join();
        close((*it)->fd);
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
    if (static_cast<int>(connections_.size()) >= options_.max_connections) {
      LOG(WARNING) << "shared-memory Engram connection refused: "
                   << options_.max_connections << " are open";
      close(fd);
      continue;
    }
    auto connection = std::make_unique<Connection>();
    connection->fd = fd;
    Connection* c = connection.get();
    connections_.push_back(std::move(connection));
    c->thread = std::thread([this, c] { Serve(c); });
  }
}

void ShmEngramServer::Record(const char* method, int code, int64_t rows,
                             absl::Time start) const {
  if (metrics_->calls == nullptr) return;
  const std::string code_name =
      absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  if (absl::StatusOr<Counter*> c = metrics_->calls->Get({method, code_name});
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

void ShmEngramServer::Serve(Connection* connection) {
  const int fd = connection->fd;
  const uint64_t request_bytes = options_.request_bytes;
  const uint64_t response_bytes = options_.response_bytes;
  const uint64_t area_bytes =
      shm::kControlBytes + request_bytes + response_bytes;
  uint8_t* area = nullptr;
  // Ends the connection: the socket closes, the client sees it.
  auto finish = [&](const absl::Status& why) {
    if (!why.ok() && why.code() != absl::StatusCode::kUnavailable) {
      LOG(WARNING) << "shared-memory Engram connection closed: " << why;
    }
    shm::UnmapArea(area, area_bytes);
    // The fd stays open (shut down) until the thread is joined: Shutdown may
    // still shut it down, and a closed number could be reused meanwhile.
    shutdown(fd, SHUT_RDWR);
    connection->done.store(true);
  };
  absl::StatusOr<int> memfd = shm::CreateArea(area_bytes);
  if (!memfd.ok()) return finish(memfd.status());
  absl::StatusOr<uint8_t*> mapped = shm::MapArea(*memfd, area_bytes);
  if (!mapped.ok()) {
    close(*memfd);
    return finish(mapped.status());
  }
  area = *mapped;
  auto* const control = new (area) shm::Control();
  uint8_t* const request_area = area + shm::kControlBytes;
  uint8_t* const response = request_area + request_bytes;
  const absl::Duration spin = options_.spin;
  // Messages taken from the client's mailbox so far.
  uint64_t calls_seen = 0;
  // Takes the client's next message (a copy: the client could change the
  // slot meanwhile), waiting until `deadline`.
  auto next_call = [&](absl::Time deadline, Call* call) -> absl::Status {
    RETURN_IF_ERROR(shm::Await(fd, control->calls_posted, calls_seen,
                               control->store_blocked, spin, deadline));
    if (control->calls_posted.load() != calls_seen + 1) {
      return absl::DataLossError("the client posted several calls at once");
    }
    ++calls_seen;
    *call = control->call;
    return absl::OkStatus();
  };
  auto post = [&](const Reply& reply) {
    return shm::Post(fd, control->reply, control->replies_posted,
                     control->client_blocked, reply);
  };
  shm::Hello hello;
  hello.request_bytes = request_bytes;
  hello.response_bytes = response_bytes;
  const absl::Status sent = shm::Send(fd, &hello, sizeof(hello), *memfd);
  close(*memfd);
  if (!sent.ok()) return finish(sent);
  ucred peer{};
  socklen_t peer_size = sizeof(peer);
  getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &peer_size);
  LOG(INFO) << "shared-memory Engram connection from pid " << peer.pid;

  // Sends an error reply (the text in the response area).
  auto send_error = [&](uint64_t seq, const absl::Status& status) {
    Reply reply;
    reply.seq = seq;
    reply.code = static_cast<int32_t>(status.code());
    const std::string text(status.message());
    reply.payload_len = std::min<uint64_t>(text.size(), response_bytes);
    std::memcpy(response, text.data(), reply.payload_len);
    return post(reply);
  };
  // Sends a serialized response proto.
  auto send_proto = [&](uint64_t seq, const google::protobuf::Message& m) {
    const size_t size = m.ByteSizeLong();
    if (size > response_bytes) {
      return send_error(seq, absl::ResourceExhaustedError(
                                 "the response exceeds the shared area"));
    }
    m.SerializeWithCachedSizesToArray(response);
    Reply reply;
    reply.seq = seq;
    reply.payload_len = size;
    return post(reply);
  };

  for (;;) {
    Call call;
    // Idle connections wait without a deadline (Shutdown wakes them).
    absl::Status received = next_call(absl::InfiniteFuture(), &call);
    if (!received.ok()) return finish(received);
    const absl::Time start = absl::Now();
    const Op op = static_cast<Op>(call.op);
    if (call.magic != shm::kMagic ||
        (op != Op::kLookup && op != Op::kLookupStream && op != Op::kPrefetch &&
         op != Op::kDescribe)) {
      return finish(absl::DataLossError(
          absl::StrCat("a call with magic ", call.magic, " and op ", call.op)));
    }
    if (call.request_len > request_bytes) {
      return finish(absl::DataLossError(
          absl::StrCat("a request of ", call.request_len, " bytes in a ",
                       request_bytes, "-byte area")));
    }
    absl::Time deadline = start + options_.default_timeout;
    if (call.deadline_unix_ns > 0) {
      deadline = std::min(deadline, absl::FromUnixNanos(call.deadline_unix_ns));
    }
    const char* method = MethodName(op);
    std::optional<InflightGate::Pass> pass = gate_->Enter();
    if (!pass.has_value()) {
      const absl::Status s =
          absl::UnavailableError("the engram store is draining");
      Record(method, static_cast<int>(s.code()), 0, start);
      if (absl::Status e = send_error(call.seq, s); !e.ok()) return finish(e);
      continue;
    }
    absl::Status outcome;
    int64_t rows_done = 0;
    if (op == Op::kDescribe) {
      v1::DescribeResponse r;
      handler_->Describe(&r);
      if (absl::Status e = send_proto(call.seq, r); !e.ok()) return finish(e);
    } else if (op == Op::kPrefetch) {
      v1::PrefetchRequest request;
      v1::PrefetchResponse r;
      if (!request.ParseFromArray(request_area,
                                  static_cast<int>(call.request_len))) {
        outcome =
            absl::InvalidArgumentError("the Prefetch request does not parse");
      } else {
        outcome = handler_->Prefetch(request, &r);
      }
      rows_done = outcome.ok() ? r.rows_queued() : 0;
      absl::Status e = outcome.ok() ? send_proto(call.seq, r)
                                    : send_error(call.seq, outcome);
      if (!e.ok()) return finish(e);
    } else {
      v1::LookupRequest request;
      absl::StatusOr<ResolvedRequest> resolved;
      if (!request.ParseFromArray(request_area,
                                  static_cast<int>(call.request_len))) {
        resolved = absl::InvalidArgumentError(
            absl::StrCat("the ", method, " request does not parse"));
      } else {
        resolved = handler_->ResolveLookup(
            request, op == Op::kLookup
                         ? handler_->limits().max_rows_per_request
                         : handler_->limits().max_rows_per_stream);
      }
      if (!resolved.ok()) {
        outcome = resolved.status();
        if (absl::Status e = send_error(call.seq, outcome); !e.ok()) {
          return finish(e);
        }
      } else {
        // Pieces of as many rows (and their ids) as the area holds.
        const size_t row_bytes = resolved->row_bytes;
        const size_t total = resolved->row_ids.size();
        const size_t per_piece = response_bytes / (row_bytes + 8);
        size_t first = 0;
        do {
          const size_t count = std::min(per_piece, total - first);
          outcome = handler_->LookupRowsInto(
              *resolved, first, count, deadline,
              absl::MakeSpan(response, count * row_bytes));
          if (!outcome.ok()) {
            if (absl::Status e = send_error(call.seq, outcome); !e.ok()) {
              return finish(e);
            }
            break;
          }
          std::memcpy(response + count * row_bytes,
                      resolved->row_ids.data() + first, count * 8);
          Reply reply;
          reply.seq = call.seq;
          reply.first_row = static_cast<int64_t>(first);
          reply.rows = static_cast<int64_t>(count);
          reply.total_rows = static_cast<int64_t>(total);
          reply.row_dim = static_cast<int32_t>(formats::kRowDim);
          reply.row_bytes = static_cast<int32_t>(row_bytes);
          reply.encoding = static_cast<int32_t>(resolved->wire_encoding);
          reply.row_format = static_cast<int32_t>(resolved->row_format);
          reply.global_scale = resolved->global_scale;
          if (absl::Status e = post(reply); !e.ok()) {
            return finish(e);
          }
          first += count;
          rows_done = static_cast<int64_t>(first);
          if (first < total) {
            // The client has copied the piece out when it says so.
            Call next;
            absl::Status got = next_call(deadline, &next);
            if (!got.ok()) {
              Record(method, static_cast<int>(got.code()), rows_done, start);
              return finish(got);
            }
            if (next.magic != shm::kMagic ||
                static_cast<Op>(next.op) != Op::kContinue ||
                next.seq != call.seq) {
              return finish(absl::DataLossError(
                  "a message other than the expected continuation"));
            }
          }
        } while (first < total);
      }
    }
    Record(method, static_cast<int>(outcome.code()), rows_done, start);
  }
}

}  // namespace mneme::engram
