#include "gpu/comm/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <exception>
#include <utility>

#include "absl/base/call_once.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "gpu/comm/collective_args.h"

namespace mneme::gpu {
namespace {

// Gloo's slot prefixes for its own collectives are 0x01..0x08.
constexpr uint8_t kReduceScatterSlotPrefix = 0x40;

// Keys of the rendezvous, inside the store's group prefix.
constexpr absl::string_view kKeyPrefix = "gloo/";

std::chrono::milliseconds ToMillis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// Gloo's rendezvous store on a RendezvousStore. Gloo expects failures as
// exceptions: this adapter throws gloo::IoException, and keeps the status
// behind it so that Create() can return the store's own code.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(RendezvousStore& store, absl::Duration timeout)
      : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_.Set(absl::StrCat(kKeyPrefix, key),
                     absl::string_view(data.data(), data.size())));
  }

  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::vector<std::string>> values =
        store_.Get({absl::StrCat(kKeyPrefix, key)}, timeout_);
    Check(values.status());
    return std::vector<char>((*values)[0].begin(), (*values)[0].end());
  }

  void wait(const std::vector<std::string>& keys) override {
    wait(keys, ToMillis(timeout_));
  }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> prefixed;
    prefixed.reserve(keys.size());
    for (const std::string& key : keys) {
      prefixed.push_back(absl::StrCat(kKeyPrefix, key));
    }
    // The values are small (addresses); fetching them is the wait.
    Check(store_.Get(prefixed, absl::FromChrono(timeout)).status());
  }

  const absl::Status& error() const { return error_; }

 private:
  void Check(const absl::Status& s) {
    if (s.ok()) return;
    error_ = s;
    throw gloo::IoException(std::string(s.message()));
  }

  RendezvousStore& store_;
  const absl::Duration timeout_;
  absl::Status error_;
};

// Gloo's TCP transport writes with writev(2), which cannot pass
// MSG_NOSIGNAL: a write to a peer that just died raises SIGPIPE, whose
// default action would kill this process. Ignored, the write fails with
// EPIPE and the collective with Unavailable. A handler someone installed is
// left alone.
void IgnoreSigpipeUnlessHandled() {
  static absl::once_flag once;
  absl::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 &&
        current.sa_handler == SIG_DFL) {
      signal(SIGPIPE, SIG_IGN);
    }
  });
}

// A Gloo failure as a status: timeouts (Gloo says "Timed out ..." or
// "Application timeout ...") are DeadlineExceeded, anything else a broken
// transport or a peer gone: Unavailable.
absl::Status FromGlooException(absl::string_view what,
                               absl::string_view message, absl::Duration spent,
                               absl::Duration timeout) {
  const std::string lower = absl::AsciiStrToLower(message);
  const bool timed_out = absl::StrContains(lower, "timed out") ||
                         absl::StrContains(lower, "timeout") ||
                         spent >= timeout;
  const std::string text = absl::StrCat("gloo ", what, " failed: ", message);
  return timed_out ? absl::DeadlineExceededError(text)
                   : absl::UnavailableError(text);
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    const GlooCommunicatorOptions& options, RendezvousStore& store) {
  RETURN_IF_ERROR(CheckGroupArgs(options.rank, options.size, options.timeout));
  if (options.hostname.empty() && options.interface.empty()) {
    return absl::InvalidArgumentError("hostname or interface is required");
  }

  IgnoreSigpipeUnlessHandled();
  std::shared_ptr<gloo::transport::Device> device;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    attr.iface = options.interface;
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.interface.empty() ? "hostname \"" : "interface \"",
        options.interface.empty() ? options.hostname : options.interface,
        "\" cannot be used for the TCP transport: ", e.what()));
  }

  StoreAdapter adapter(store, options.timeout);
  auto context =
      std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
  const absl::Time start = absl::Now();
  try {
    context->setTimeout(ToMillis(options.timeout));
    context->connectFullMesh(adapter, device);
  } catch (const std::exception& e) {
    const std::string what =
        absl::StrCat("rendezvous of rank ", options.rank, " of ", options.size);
    if (!adapter.error().ok()) {
      return absl::Status(
          adapter.error().code(),
          absl::StrCat(what, " failed: ", adapter.error().message()));
    }
    return FromGlooException(what, e.what(), absl::Now() - start,
                             options.timeout);
  }
  return std::unique_ptr<GlooCommunicator>(
      new GlooCommunicator(options, std::move(context)));
}

GlooCommunicator::~GlooCommunicator() = default;

template <typename Op>
absl::Status GlooCommunicator::Run(absl::string_view name, int64_t bytes,
                                   Op op) {
  const absl::Time start = absl::Now();
  try {
    op();
  } catch (const std::exception& e) {
    broken_ = FromGlooException(name, e.what(), absl::Now() - start,
                                options_.timeout);
  } catch (...) {
    broken_ = absl::UnavailableError(
        absl::StrCat("gloo ", name, " failed with an unknown exception"));
  }
  ++stats_.calls;
  stats_.bytes += bytes;
  stats_.time += absl::Now() - start;
  return broken_;
}

absl::Status GlooCommunicator::AllReduceSum(float* data, int64_t count) {
  if (!broken_.ok()) return broken_;
  RETURN_IF_ERROR(CheckCollectiveArgs(count, 1, {data}));
  const uint32_t tag = next_tag_++;
  return Run("all-reduce", count * sizeof(float), [&] {
    if (count == 0 || options_.size == 1) return;
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, static_cast<size_t>(count));
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(
            &gloo::sum<float>));
    opts.setTag(tag);
    opts.setTimeout(ToMillis(options_.timeout));
    gloo::allreduce(opts);
  });
}

absl::Status GlooCommunicator::AllGather(const float* in, int64_t count,
                                         float* out) {
  if (!broken_.ok()) return broken_;
  const int64_t n = options_.size;
  RETURN_IF_ERROR(CheckCollectiveArgs(count, n, {in, out}));
  const uint32_t tag = next_tag_++;
  return Run("all-gather", count * sizeof(float), [&] {
    if (count == 0) return;
    if (n == 1) {
      std::memmove(out, in, count * sizeof(float));
      return;
    }
    gloo::AllgatherOptions opts(context_);
    opts.setInput(const_cast<float*>(in), static_cast<size_t>(count));
    opts.setOutput(out, static_cast<size_t>(count * n));
    opts.setTag(tag);
    opts.setTimeout(ToMillis(options_.timeout));
    gloo::allgather(opts);
  });
}

absl::Status GlooCommunicator::ReduceScatterSum(const float* in, int64_t count,
                                                float* out) {
  if (!broken_.ok()) return broken_;
  const int64_t n = options_.size;
  RETURN_IF_ERROR(CheckCollectiveArgs(count, n, {in, out}));
  const uint32_t tag = next_tag_++;
  return Run("reduce-scatter", count * n * sizeof(float), [&] {
    if (count == 0) return;
    if (n == 1) {
      std::memmove(out, in, count * sizeof(float));
      return;
    }
    RingReduceScatter(in, count, out, tag);
  });
}

// Ring reduce-scatter: at step s (0 .. n-2) rank r sends its partial sum of
// chunk (r - s - 1) mod n to rank r + 1 and receives rank r - 1's partial
// sum of chunk (r - s - 2) mod n, adding its own input to it; after n - 1
// steps it holds the full sum of chunk r. The partial sum lives in `out`,
// the received one in scratch_.
void GlooCommunicator::RingReduceScatter(const float* in, int64_t count,
                                         float* out, uint32_t tag) {
  const int n = options_.size;
  const int r = options_.rank;
  const int right = (r + 1) % n;
  const int left = (r + n - 1) % n;
  const size_t chunk_bytes = count * sizeof(float);
  scratch_.resize(count);
  std::unique_ptr<gloo::transport::UnboundBuffer> in_buf =
      context_->createUnboundBuffer(const_cast<float*>(in), n * chunk_bytes);
  std::unique_ptr<gloo::transport::UnboundBuffer> out_buf =
      context_->createUnboundBuffer(out, chunk_bytes);
  std::unique_ptr<gloo::transport::UnboundBuffer> recv_buf =
      context_->createUnboundBuffer(scratch_.data(), chunk_bytes);
  const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, tag);
  const auto deadline =
      std::chrono::steady_clock::now() + ToMillis(options_.timeout);
  auto remaining = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now()));
  };
  for (int s = 0; s < n - 1; ++s) {
    const int send_chunk = ((r - s - 1) % n + n) % n;
    const int recv_chunk = ((r - s - 2) % n + n) % n;
    recv_buf->recv(left, slot);
    gloo::transport::UnboundBuffer* send_buf = out_buf.get();
    if (s == 0) {
      send_buf = in_buf.get();
      send_buf->send(right, slot, send_chunk * chunk_bytes, chunk_bytes);
    } else {
      send_buf->send(right, slot);
    }
    if (!recv_buf->waitRecv(remaining()) || !send_buf->waitSend(remaining())) {
      throw gloo::IoException("reduce-scatter aborted");
    }
    const float* own = in + static_cast<int64_t>(recv_chunk) * count;
    for (int64_t i = 0; i < count; ++i) out[i] = scratch_[i] + own[i];
  }
}

absl::Status GlooCommunicator::Broadcast(float* data, int64_t count, int root) {
  if (!broken_.ok()) return broken_;
  RETURN_IF_ERROR(CheckRoot(root, options_.size));
  RETURN_IF_ERROR(CheckCollectiveArgs(count, 1, {data}));
  const uint32_t tag = next_tag_++;
  const int64_t bytes = options_.rank == root ? count * sizeof(float) : 0;
  return Run("broadcast", bytes, [&] {
    if (count == 0 || options_.size == 1) return;
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(data, static_cast<size_t>(count));
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(ToMillis(options_.timeout));
    gloo::broadcast(opts);
  });
}

absl::Status GlooCommunicator::Barrier() {
  if (!broken_.ok()) return broken_;
  const uint32_t tag = next_tag_++;
  return Run("barrier", 0, [&] {
    if (options_.size == 1) return;
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(ToMillis(options_.timeout));
    gloo::barrier(opts);
  });
}

}  // namespace mneme::gpu
