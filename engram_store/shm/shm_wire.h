#ifndef MNEME_ENGRAM_STORE_SHM_SHM_WIRE_H_
#define MNEME_ENGRAM_STORE_SHM_SHM_WIRE_H_

// The same-node Engram transport: a worker and its node's engram store
// exchange requests and rows through a shared memory area instead of gRPC
// messages. Both sides are on one machine, so the control messages are plain
// structs in the machine's byte order.
//
// A connection is a Unix SOCK_SEQPACKET socket (the store's --shm_socket
// path; access is the socket file's permissions). On accept the store makes
// a memfd of request_bytes + response_bytes, sends Hello with the memfd
// (SCM_RIGHTS), and both map it. Then, one call at a time:
//
//   client: writes the serialized request proto at offset 0 of the area,
//           sends Call {op, seq, request_len, deadline}.
//   store:  validates the Call (any malformed message closes the
//           connection), parses the request, and answers with Reply:
//           - an error: code != 0, the message text in the response area;
//           - Describe / Prefetch: the serialized response proto there;
//           - Lookup / LookupStream: a piece of rows (rows * row_bytes
//             bytes) then their row ids (rows int64s) there, first_row and
//             total_rows telling where it is; after each piece but the last
//             the store waits for Call {op = kContinue, same seq} before
//             overwriting the area.
//
// Every wait is bounded by the call's deadline; a peer that vanishes is seen
// as the socket closing. Neither side trusts the other's lengths: each is
// checked against the area before it is used.

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mneme::engram::shm {

inline constexpr uint32_t kMagic = 0x48534E4D;  // "MNSH"
inline constexpr uint32_t kVersion = 1;

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
  int32_t reserved = 0;
};

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

}  // namespace mneme::engram::shm

#endif  // MNEME_ENGRAM_STORE_SHM_SHM_WIRE_H_
