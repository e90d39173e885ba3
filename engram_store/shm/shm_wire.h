#ifndef MNEME_ENGRAM_STORE_SHM_SHM_WIRE_H_
#define MNEME_ENGRAM_STORE_SHM_SHM_WIRE_H_

// The same-node Engram transport: a worker and its node's engram store
// exchange requests and rows through a shared memory area instead of gRPC
// messages. Both sides are on one machine, so the messages are plain structs
// in the machine's byte order.
//
// A connection is a Unix SOCK_SEQPACKET socket (the store's --shm_socket
// path; access is the socket file's permissions). On accept the store makes
// a memfd of kControlBytes + request_bytes + response_bytes, sends Hello with
// the memfd (SCM_RIGHTS), and both map it. The first page is a Control
// block: one mailbox each way (a message slot and a count of messages
// posted), strictly alternating, one call at a time:
//
//   client: writes the serialized request proto into the request area,
//           posts Call {op, seq, request_len, deadline}.
//   store:  validates its copy of the Call (anything malformed closes the
//           connection), parses the request, and posts a Reply:
//           - an error: code != 0, the message text in the response area;
//           - Describe / Prefetch: the serialized response proto there;
//           - Lookup / LookupStream: a piece of rows (rows * row_bytes
//             bytes) then their row ids (rows int64s) there, first_row and
//             total_rows telling where it is; after each piece but the last
//             it awaits Call {op = kContinue, same seq} before overwriting
//             the area. A lookup reply also names the table's row format
//             and global scale: a client that wants decoded rows in its
//             own buffer asks for ROW_ENCODING_RAW and decodes them there
//             (half the bytes cross between the cores, and the decode runs
//             on the caller's core, as in-process).
//
// A receiver spins on the mailbox count for a short while after its last
// message (a lookup of one token takes microseconds; waking a blocked thread
// takes tens) and then blocks on the socket; a sender rings the socket (one
// byte) only when the receiver is blocked (or about to block), so a receiver
// that is busy or spinning is never rung: no system call while both sides
// keep up, and every wait that blocks drains the doorbells pending (a ring
// for a message its last look already saw is left to the next one). The
// socket also carries the end of the connection: a peer that vanishes is seen
// as it closing. Every wait is bounded by the call's deadline. Neither side
// trusts what the other wrote: each copies a message out of the mailbox before
// checking it, and checks every length against the area before using it.

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mneme::engram::shm {

inline constexpr uint32_t kMagic = 0x48534E4D;  // "MNSH"
inline constexpr uint32_t kVersion = 3;

enum class Op : uint32_t {
  kLookup = 1,
  kLookupStream = 2,
  kPrefetch = 3,
  kDescribe = 4,
  kContinue = 5,
};

struct Hello {
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  uint64_t request_bytes = 0;
  uint64_t response_bytes = 0;
};

struct Call {
  uint32_t magic = kMagic;
  uint32_t op = 0;
  uint64_t seq = 0;
  uint64_t request_len = 0;
  // Absolute, nanoseconds since the Unix epoch (one machine, one clock).
  int64_t deadline_unix_ns = 0;
};

struct Reply {
  uint32_t magic = kMagic;
  // absl::StatusCode; 0 = OK.
  int32_t code = 0;
  uint64_t seq = 0;
  // Bytes of the error text or of the response proto (not for rows).
  uint64_t payload_len = 0;
  // Lookup pieces.
  int64_t first_row = 0;
  int64_t rows = 0;
  int64_t total_rows = 0;
  int32_t row_dim = 0;
  int32_t row_bytes = 0;
  int32_t encoding = 0;
  // The table's stored row format (formats::RowFormat) and NVFP4 global
  // scale, with which a client decodes ROW_ENCODING_RAW rows itself.
  int32_t row_format = 0;
  float global_scale = 1.0f;
  int32_t reserved = 0;
};

// The first page of the area. The counts and flags are lock-free atomics,
// which are address-free: they work across processes sharing the memory.
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);
struct Control {
  // Client -> store.
  alignas(64) std::atomic<uint64_t> calls_posted;
  Call call;
  alignas(64) std::atomic<uint32_t> store_blocked;
  // Store -> client.
  alignas(64) std::atomic<uint64_t> replies_posted;
  Reply reply;
  alignas(64) std::atomic<uint32_t> client_blocked;
};
inline constexpr uint64_t kControlBytes = 4096;
static_assert(sizeof(Control) <= kControlBytes);

// Posts `message` into a mailbox (`slot`, `posted`) and rings the socket
// when the receiver is blocked. Unavailable when the peer is gone.
template <typename T>
absl::Status Post(int socket, T& slot, std::atomic<uint64_t>& posted,
                  const std::atomic<uint32_t>& receiver_blocked,
                  const T& message);

// Waits until `posted` exceeds `seen`: spins for `spin`, then sets *blocked
// and blocks on the socket's doorbells. Unavailable when the peer closed the
// connection, DeadlineExceeded at the deadline.
absl::Status Await(int socket, const std::atomic<uint64_t>& posted,
                   uint64_t seen, std::atomic<uint32_t>& blocked,
                   absl::Duration spin, absl::Time deadline);

// Rings the doorbell (one byte).
absl::Status Ring(int socket);

// A memfd of `bytes` bytes (close-on-exec). Internal on failure.
absl::StatusOr<int> CreateArea(uint64_t bytes);

// Maps `bytes` of `fd` shared, read-write. Internal on failure.
absl::StatusOr<uint8_t*> MapArea(int fd, uint64_t bytes);
void UnmapArea(uint8_t* area, uint64_t bytes);

// Sends one message (with `fd` attached when >= 0). Unavailable when the
// peer is gone.
absl::Status Send(int socket, const void* message, size_t size, int fd = -1);

// Receives one message of exactly `size` bytes before `deadline` (and its
// attached fd into *fd when fd is not null; -1 when none). Unavailable when
// the peer closed the connection, DeadlineExceeded at the deadline,
// DataLoss for a message of another size (the connection must be closed).
absl::Status Receive(int socket, void* message, size_t size,
                     absl::Time deadline, int* fd = nullptr);

template <typename T>
absl::Status Post(int socket, T& slot, std::atomic<uint64_t>& posted,
                  const std::atomic<uint32_t>& receiver_blocked,
                  const T& message) {
  slot = message;
  // Sequentially consistent, with the receiver's "set blocked, look once
  // more" in Await: either it sees this message, or this sees it blocked and
  // rings.
  posted.fetch_add(1, std::memory_order_seq_cst);
  if (receiver_blocked.load(std::memory_order_seq_cst) == 0) {
    return absl::OkStatus();
  }
  return Ring(socket);
}

}  // namespace mneme::engram::shm

#endif  // MNEME_ENGRAM_STORE_SHM_SHM_WIRE_H_
