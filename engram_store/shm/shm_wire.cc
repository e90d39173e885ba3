#include "engram_store/shm/shm_wire.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace mneme::engram::shm {
namespace {

std::string Errno() { return std::strerror(errno); }

// A spin-wait hint: the polling core yields its pipeline (to a hyperthread
// sibling, which may be the peer) and, on x86, does not flood the memory
// system with loads of the line that the peer is about to write.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Waits until the socket is readable (or closed) before the deadline.
absl::Status WaitReadable(int socket, absl::Time deadline) {
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          "shared-memory channel: no answer before the deadline");
    }
    pollfd p{socket, POLLIN, 0};
    const int64_t ms = std::min<int64_t>(
        absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))),
        int64_t{1} << 30);
    const int ready = poll(&p, 1, static_cast<int>(ms));
    if (ready > 0) return absl::OkStatus();
    if (ready < 0 && errno != EINTR) {
      return absl::UnavailableError(
          absl::StrCat("shared-memory channel: poll: ", Errno()));
    }
    // Interrupted or timed out: look at the deadline again.
  }
}

}  // namespace

absl::StatusOr<int> CreateArea(uint64_t bytes) {
  const int fd = memfd_create("mneme-engram-shm", MFD_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("memfd_create: ", Errno()));
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const std::string error = Errno();
    close(fd);
    return absl::InternalError(
        absl::StrCat("sizing the shared area to ", bytes, " bytes: ", error));
  }
  return fd;
}

absl::StatusOr<uint8_t*> MapArea(int fd, uint64_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return absl::InternalError(
        absl::StrCat("mapping the ", bytes, "-byte shared area: ", Errno()));
  }
  return static_cast<uint8_t*>(p);
}

void UnmapArea(uint8_t* area, uint64_t bytes) {
  if (area != nullptr) munmap(area, bytes);
}

absl::Status Send(int socket, const void* message, size_t size, int fd) {
  iovec iov{const_cast<void*>(message), size};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  }
  for (;;) {
    const ssize_t n = sendmsg(socket, &msg, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(size)) return absl::OkStatus();
    if (n < 0 && errno == EINTR) continue;
    return absl::UnavailableError(
        absl::StrCat("shared-memory channel: send failed: ",
                     n < 0 ? Errno() : "short write"));
  }
}

absl::Status Receive(int socket, void* message, size_t size,
                     absl::Time deadline, int* fd) {
  if (fd != nullptr) *fd = -1;
  RETURN_IF_ERROR(WaitReadable(socket, deadline));
  iovec iov{message, size};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  // Close any fd that arrived, unless the caller takes it.
  int received_fd = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
       c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
        c->cmsg_len >= CMSG_LEN(sizeof(int))) {
      int got = -1;
      std::memcpy(&got, CMSG_DATA(c), sizeof(int));
      if (received_fd >= 0 || fd == nullptr) {
        close(got);
      } else {
        received_fd = got;
      }
    }
  }
  if (n == 0) {
    if (received_fd >= 0) close(received_fd);
    return absl::UnavailableError("shared-memory channel: the peer closed it");
  }
  if (n < 0) {
    if (received_fd >= 0) close(received_fd);
    return absl::UnavailableError(
        absl::StrCat("shared-memory channel: receive failed: ", Errno()));
  }
  if (static_cast<size_t>(n) != size || (msg.msg_flags & MSG_TRUNC) != 0) {
    if (received_fd >= 0) close(received_fd);
    return absl::DataLossError(
        absl::StrCat("shared-memory channel: a message of ", n,
                     (msg.msg_flags & MSG_TRUNC) != 0 ? "+" : "",
                     " bytes where ", size, " were expected"));
  }
  if (fd != nullptr) *fd = received_fd;
  return absl::OkStatus();
}

absl::Status Ring(int socket) {
  const char byte = 1;
  for (;;) {
    const ssize_t n = send(socket, &byte, 1, MSG_NOSIGNAL);
    if (n == 1) return absl::OkStatus();
    if (n < 0 && errno == EINTR) continue;
    return absl::UnavailableError(
        absl::StrCat("shared-memory channel: ringing failed: ",
                     n < 0 ? Errno() : "short write"));
  }
}

absl::Status Await(int socket, const std::atomic<uint64_t>& posted,
                   uint64_t seen, std::atomic<uint32_t>& blocked,
                   absl::Duration spin, absl::Time deadline) {
  auto arrived = [&] { return posted.load(std::memory_order_seq_cst) > seen; };
  if (arrived()) return absl::OkStatus();
  if (spin > absl::ZeroDuration()) {
    const absl::Time until = std::min(deadline, absl::Now() + spin);
    for (int i = 0;; ++i) {
      if (arrived()) return absl::OkStatus();
      CpuRelax();
      // The clock is read every 64 polls.
      if ((i & 63) == 63 && absl::Now() >= until) break;
    }
  }
  // Blocked from here: set the flag, then look once more. A message posted
  // before the sender saw the flag is seen here; one after, it rings for.
  blocked.store(1, std::memory_order_seq_cst);
  struct Unblock {
    std::atomic<uint32_t>& flag;
    ~Unblock() { flag.store(0, std::memory_order_seq_cst); }
  } unblock{blocked};
  for (;;) {
    if (arrived()) return absl::OkStatus();
    RETURN_IF_ERROR(WaitReadable(socket, deadline));
    // Drain the doorbells (this wait's, and any rung for messages that
    // earlier waits' last looks saw); EOF is the peer gone.
    char bytes[64];
    for (;;) {
      const ssize_t n = recv(socket, bytes, sizeof(bytes), MSG_DONTWAIT);
      if (n > 0) continue;
      if (n == 0) {
        // A message posted just before the peer went is still its answer.
        if (arrived()) return absl::OkStatus();
        return absl::UnavailableError(
            "shared-memory channel: the peer closed it");
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return absl::UnavailableError(
          absl::StrCat("shared-memory channel: receive failed: ", Errno()));
    }
  }
}

}  // namespace mneme::engram::shm
