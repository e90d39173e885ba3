#include "engram_store/client/shm_engram_client.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "engram_store/shm/shm_wire.h"
#include "formats/row_decode.h"
#include "formats/row_format.h"

namespace mneme::engram {
namespace {

using shm::Call;
using shm::Op;
using shm::Reply;

// Largest area a store may offer (as the server's limit).
constexpr uint64_t kMaxAreaBytes = uint64_t{1} << 34;

}  // namespace

struct ShmEngramClient::Piece {
  const Reply* reply;
  const uint8_t* rows;     // reply->rows * reply->row_bytes bytes
  const uint8_t* row_ids;  // reply->rows int64s (unaligned)
};

namespace {

// A lookup piece appended to a response (rows, ids, and the shape fields).
void AppendPiece(const ShmEngramClient::Piece& p,
                 v1::LookupResponse* response) {
  const Reply& r = *p.reply;
  response->mutable_rows()->append(reinterpret_cast<const char*>(p.rows),
                                   static_cast<size_t>(r.rows * r.row_bytes));
  for (int64_t i = 0; i < r.rows; ++i) {
    int64_t id = 0;
    std::memcpy(&id, p.row_ids + i * 8, 8);
    response->add_row_ids(id);
  }
  response->set_row_dim(r.row_dim);
  response->set_row_bytes(r.row_bytes);
  response->set_encoding(static_cast<v1::RowEncoding>(r.encoding));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmEngramClient>> ShmEngramClient::Create(
    const ShmEngramClientOptions& options) {
  sockaddr_un addr{};
  if (options.socket_path.empty() ||
      options.socket_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ShmEngramClientOptions.socket_path must be 1 to ",
        sizeof(addr.sun_path) - 1, " bytes, got '", options.socket_path, "'"));
  }
  if (options.timeout <= absl::ZeroDuration() || options.max_attempts < 1 ||
      options.initial_backoff < absl::ZeroDuration() ||
      options.max_backoff < options.initial_backoff ||
      options.reconnect_interval < absl::ZeroDuration() ||
      options.spin < absl::ZeroDuration() ||
      options.spin > absl::Milliseconds(10)) {
    return absl::InvalidArgumentError(
        "ShmEngramClientOptions: timeout must be > 0, max_attempts >= 1, "
        "0 <= initial_backoff <= max_backoff, reconnect_interval >= 0, "
        "0 <= spin <= 10ms");
  }
  return std::unique_ptr<ShmEngramClient>(new ShmEngramClient(options));
}

ShmEngramClient::~ShmEngramClient() {
  absl::MutexLock lock(&mu_);
  Disconnect();
}

bool ShmEngramClient::last_call_used_shared_memory() const {
  absl::MutexLock lock(&mu_);
  return last_shared_;
}

void ShmEngramClient::Disconnect() {
  shm::UnmapArea(area_, shm::kControlBytes + request_bytes_ + response_bytes_);
  area_ = nullptr;
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::Status ShmEngramClient::Connect(absl::Time deadline) {
  unreachable_ = false;
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("socket(AF_UNIX): ", std::strerror(errno)));
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, options_.socket_path.data(),
              options_.socket_path.size());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int error = errno;
    close(fd);
    unreachable_ = error == ENOENT || error == ECONNREFUSED ||
                   error == EACCES || error == ENOTDIR;
    return absl::UnavailableError(
        absl::StrCat("cannot reach the engram store's shared-memory socket ",
                     options_.socket_path, ": ", std::strerror(error)));
  }
  shm::Hello hello;
  int memfd = -1;
  absl::Status got = shm::Receive(fd, &hello, sizeof(hello), deadline, &memfd);
  if (!got.ok()) {
    close(fd);
    return got;
  }
  auto fail = [&](absl::Status status) {
    if (memfd >= 0) close(memfd);
    close(fd);
    return status;
  };
  if (hello.magic == shm::kMagic && hello.version != shm::kVersion) {
    // Another release of the protocol (a rolling upgrade): the gRPC path
    // serves meanwhile.
    unreachable_ = true;
    return fail(absl::UnavailableError(absl::StrCat(
        "the shared-memory socket ", options_.socket_path,
        " speaks protocol version ", hello.version, ", this client ",
        shm::kVersion, " (a store of another release)")));
  }
  if (hello.magic != shm::kMagic) {
    return fail(absl::DataLossError(absl::StrCat(
        "the shared-memory socket ", options_.socket_path,
        " answered with magic ", hello.magic, " version ", hello.version,
        " (expected ", shm::kMagic, " version ", shm::kVersion, ")")));
  }
  if (memfd < 0 || hello.request_bytes < 4096 ||
      hello.request_bytes > kMaxAreaBytes || hello.response_bytes < 4096 ||
      hello.response_bytes > kMaxAreaBytes) {
    return fail(absl::DataLossError(
        absl::StrCat("the store's shared-memory hello is malformed (area ",
                     hello.request_bytes, " + ", hello.response_bytes,
                     " bytes, fd ", memfd, ")")));
  }
  struct stat st {};
  const uint64_t total =
      shm::kControlBytes + hello.request_bytes + hello.response_bytes;
  if (fstat(memfd, &st) != 0 || static_cast<uint64_t>(st.st_size) < total) {
    return fail(
        absl::DataLossError("the store's shared area is smaller than it says"));
  }
  absl::StatusOr<uint8_t*> area = shm::MapArea(memfd, total);
  if (!area.ok()) return fail(area.status());
  close(memfd);
  fd_ = fd;
  area_ = *area;
  request_bytes_ = hello.request_bytes;
  response_bytes_ = hello.response_bytes;
  replies_seen_ = 0;
  return absl::OkStatus();
}

absl::Status ShmEngramClient::CallOnce(uint32_t op,
                                       const google::protobuf::Message& request,
                                       const PieceSink& sink,
                                       std::string* payload) {
  const absl::Time deadline = absl::Now() + options_.timeout;
  if (fd_ < 0) RETURN_IF_ERROR(Connect(deadline));
  const size_t size = request.ByteSizeLong();
  if (size > request_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a request of ", size, " bytes exceeds the shared area's ",
                     request_bytes_));
  }
  auto* const control = reinterpret_cast<shm::Control*>(area_);
  uint8_t* const request_area = area_ + shm::kControlBytes;
  request.SerializeWithCachedSizesToArray(request_area);
  Call call;
  call.op = op;
  call.seq = ++seq_;
  call.request_len = size;
  call.deadline_unix_ns = absl::ToUnixNanos(deadline);
  // Any transport failure leaves the connection in an unknown state: a
  // late answer must never be taken for the next call's.
  auto drop = [this](absl::Status status) {
    Disconnect();
    return status;
  };
  auto post = [&](const Call& message) {
    return shm::Post(fd_, control->call, control->calls_posted,
                     control->store_blocked, message);
  };
  if (absl::Status s = post(call); !s.ok()) return drop(s);
  const uint8_t* response = request_area + request_bytes_;
  int64_t next_row = 0;
  for (;;) {
    if (absl::Status s =
            shm::Await(fd_, control->replies_posted, replies_seen_,
                       control->client_blocked, options_.spin, deadline);
        !s.ok()) {
      return drop(s);
    }
    if (control->replies_posted.load() != replies_seen_ + 1) {
      return drop(absl::DataLossError("the store posted several answers"));
    }
    ++replies_seen_;
    // A copy: the store's slot is not to be read twice.
    const Reply reply = control->reply;
    if (reply.magic != shm::kMagic || reply.seq != call.seq) {
      return drop(absl::DataLossError(
          absl::StrCat("the store's answer has magic ", reply.magic,
                       " and sequence ", reply.seq, ", expected ", call.seq)));
    }
    if (reply.code != 0) {
      if (reply.payload_len > response_bytes_ || reply.code < 0 ||
          reply.code >
              static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
        return drop(
            absl::DataLossError("the store's error answer is malformed"));
      }
      return absl::Status(static_cast<absl::StatusCode>(reply.code),
                          std::string(reinterpret_cast<const char*>(response),
                                      reply.payload_len));
    }
    if (!sink) {
      if (reply.payload_len > response_bytes_) {
        return drop(absl::DataLossError("the store's answer is malformed"));
      }
      payload->assign(reinterpret_cast<const char*>(response),
                      reply.payload_len);
      return absl::OkStatus();
    }
    // A piece of rows: where it says it is, within the area.
    if (reply.rows < 0 || reply.row_bytes <= 0 || reply.total_rows < 0 ||
        reply.first_row != next_row ||
        reply.rows > reply.total_rows - reply.first_row ||
        static_cast<uint64_t>(reply.rows) >
            response_bytes_ / (static_cast<uint64_t>(reply.row_bytes) + 8) ||
        (reply.rows == 0 && reply.total_rows != reply.first_row)) {
      return drop(absl::DataLossError(absl::StrCat(
          "the store's lookup answer is malformed (rows ", reply.first_row,
          " + ", reply.rows, " of ", reply.total_rows, ", ", reply.row_bytes,
          " bytes each)")));
    }
    const Piece piece{&reply, response,
                      response + reply.rows * reply.row_bytes};
    // A piece refused midway leaves the store waiting for a continuation:
    // the connection goes with it.
    if (absl::Status s = sink(piece); !s.ok()) return drop(s);
    next_row += reply.rows;
    if (next_row == reply.total_rows) return absl::OkStatus();
    Call more;
    more.op = static_cast<uint32_t>(Op::kContinue);
    more.seq = call.seq;
    if (absl::Status s = post(more); !s.ok()) return drop(s);
  }
}

absl::Status ShmEngramClient::Dispatch(
    const std::function<absl::Status()>& attempt,
    const std::function<absl::Status(EngramClient&)>& fallback) {
  {
    absl::MutexLock lock(&mu_);
    if (options_.fallback == nullptr || absl::Now() >= fallback_until_) {
      absl::Duration backoff = options_.initial_backoff;
      absl::Status status;
      for (int i = 0; i < options_.max_attempts; ++i) {
        if (i > 0) {
          // Seeded only when a retry needs it (a random_device read is a
          // system call; the common call has no retry).
          thread_local std::mt19937_64 rng(std::random_device{}());
          std::uniform_real_distribution<double> jitter(0.5, 1.0);
          absl::SleepFor(backoff * jitter(rng));
          backoff = std::min(backoff * 2, options_.max_backoff);
        }
        status = attempt();
        if (status.code() != absl::StatusCode::kUnavailable) break;
        if (unreachable_ && options_.fallback != nullptr) break;
      }
      if (!(unreachable_ && options_.fallback != nullptr &&
            status.code() == absl::StatusCode::kUnavailable)) {
        last_shared_ = true;
        return status;
      }
      fallback_until_ = absl::Now() + options_.reconnect_interval;
    }
    last_shared_ = false;
  }
  return fallback(*options_.fallback);
}

absl::StatusOr<v1::LookupResponse> ShmEngramClient::LookupAsResponse(
    const v1::LookupRequest& request, bool stream) {
  v1::LookupResponse response;
  auto sink = [&response](const Piece& p) {
    AppendPiece(p, &response);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(Dispatch(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        response.Clear();
        return CallOnce(
            static_cast<uint32_t>(stream ? Op::kLookupStream : Op::kLookup),
            request, sink, nullptr);
      },
      [&](EngramClient& fallback) {
        absl::StatusOr<v1::LookupResponse> r =
            stream ? fallback.LookupStream(request) : fallback.Lookup(request);
        if (!r.ok()) return r.status();
        response = *std::move(r);
        return absl::OkStatus();
      }));
  return response;
}

absl::StatusOr<v1::LookupResponse> ShmEngramClient::Lookup(
    const v1::LookupRequest& request) {
  return LookupAsResponse(request, /*stream=*/false);
}

absl::StatusOr<v1::LookupResponse> ShmEngramClient::LookupStream(
    const v1::LookupRequest& request) {
  return LookupAsResponse(request, /*stream=*/true);
}

absl::StatusOr<int32_t> ShmEngramClient::LookupInto(
    const v1::LookupRequest& request, bool stream, absl::Span<uint8_t> rows) {
  // Decoded rows are asked for raw and decoded here, into `rows` (see
  // shm_wire.h); raw rows, or an encoding the store is to refuse, go as
  // asked.
  const v1::RowEncoding asked = request.encoding();
  const bool decode_here = asked == v1::ROW_ENCODING_UNSPECIFIED ||
                           asked == v1::ROW_ENCODING_BF16 ||
                           asked == v1::ROW_ENCODING_FP32;
  const size_t out_row_bytes =
      size_t{formats::kRowDim} * (asked == v1::ROW_ENCODING_FP32 ? 4 : 2);
  int32_t row_dim = 0;
  auto sink = [&](const Piece& p) {
    const Reply& r = *p.reply;
    const uint64_t row_bytes =
        decode_here ? out_row_bytes : static_cast<uint64_t>(r.row_bytes);
    // Divided, not multiplied: a total the store made up must not wrap
    // around into the caller's size (CallOnce bounds each piece by it).
    if (rows.size() % row_bytes != 0 ||
        static_cast<uint64_t>(r.total_rows) != rows.size() / row_bytes) {
      return absl::DataLossError(
          absl::StrCat("the lookup returned ", r.total_rows, " rows of ",
                       row_bytes, " bytes, expected ", rows.size(), " bytes"));
    }
    uint8_t* const out = rows.data() + r.first_row * row_bytes;
    row_dim = r.row_dim;
    const size_t in_bytes = static_cast<size_t>(r.rows * r.row_bytes);
    if (!decode_here) {
      std::memcpy(out, p.rows, in_bytes);
      return absl::OkStatus();
    }
    const auto format = static_cast<formats::RowFormat>(r.row_format);
    if (r.encoding != v1::ROW_ENCODING_RAW ||
        (format != formats::RowFormat::kFp8 &&
         format != formats::RowFormat::kNvfp4) ||
        static_cast<size_t>(r.row_bytes) != formats::RowBytes(format) ||
        r.row_dim != formats::kRowDim) {
      return absl::DataLossError(
          absl::StrCat("the store answered a raw lookup with encoding ",
                       r.encoding, ", row format ", r.row_format, ", ",
                       r.row_bytes, "-byte rows of ", r.row_dim, " values"));
    }
    const formats::RowDecodeOptions options{.format = format,
                                            .global_scale = r.global_scale};
    const absl::Span<const uint8_t> in(p.rows, in_bytes);
    const size_t values = static_cast<size_t>(r.rows) * formats::kRowDim;
    absl::Status decoded =
        asked == v1::ROW_ENCODING_FP32
            ? formats::DecodeRowsF32(
                  options, in,
                  absl::MakeSpan(reinterpret_cast<float*>(out), values))
            : formats::DecodeRowsBf16(
                  options, in,
                  absl::MakeSpan(reinterpret_cast<uint16_t*>(out), values));
    if (!decoded.ok()) {
      return absl::DataLossError(absl::StrCat(
          "the store's raw rows do not decode: ", decoded.message()));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(Dispatch(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        const v1::LookupRequest* sent = &request;
        if (decode_here) {
          raw_request_.CopyFrom(request);
          raw_request_.set_encoding(v1::ROW_ENCODING_RAW);
          sent = &raw_request_;
        }
        return CallOnce(
            static_cast<uint32_t>(stream ? Op::kLookupStream : Op::kLookup),
            *sent, sink, nullptr);
      },
      [&](EngramClient& fallback) {
        absl::StatusOr<int32_t> r = fallback.LookupInto(request, stream, rows);
        if (!r.ok()) return r.status();
        row_dim = *r;
        return absl::OkStatus();
      }));
  return row_dim;
}

absl::StatusOr<v1::PrefetchResponse> ShmEngramClient::Prefetch(
    const v1::PrefetchRequest& request) {
  v1::PrefetchResponse response;
  RETURN_IF_ERROR(Dispatch(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        std::string payload;
        RETURN_IF_ERROR(CallOnce(static_cast<uint32_t>(Op::kPrefetch), request,
                                 nullptr, &payload));
        if (!response.ParseFromString(payload)) {
          Disconnect();
          return absl::DataLossError(
              "the store's Prefetch answer does not parse");
        }
        return absl::OkStatus();
      },
      [&](EngramClient& fallback) {
        absl::StatusOr<v1::PrefetchResponse> r = fallback.Prefetch(request);
        if (!r.ok()) return r.status();
        response = *std::move(r);
        return absl::OkStatus();
      }));
  return response;
}

absl::StatusOr<v1::DescribeResponse> ShmEngramClient::Describe() {
  v1::DescribeResponse response;
  const v1::DescribeRequest request;
  RETURN_IF_ERROR(Dispatch(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        std::string payload;
        RETURN_IF_ERROR(CallOnce(static_cast<uint32_t>(Op::kDescribe), request,
                                 nullptr, &payload));
        if (!response.ParseFromString(payload)) {
          Disconnect();
          return absl::DataLossError(
              "the store's Describe answer does not parse");
        }
        return absl::OkStatus();
      },
      [&](EngramClient& fallback) {
        absl::StatusOr<v1::DescribeResponse> r = fallback.Describe();
        if (!r.ok()) return r.status();
        response = *std::move(r);
        return absl::OkStatus();
      }));
  return response;
}

}  // namespace mneme::engram
