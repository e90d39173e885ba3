#include "common/connection_probe.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace mneme {
namespace {

// An endpoint in a comparable form.
struct Endpoint {
  int family = 0;
  unsigned char address[16] = {};
  int port = -1;
};

bool ParseEndpoint(absl::string_view addr, int port, Endpoint& out) {
  const std::string a(addr);
  out.port = port;
  if (inet_pton(AF_INET, a.c_str(), out.address) == 1) {
    out.family = AF_INET;
    return true;
  }
  if (inet_pton(AF_INET6, a.c_str(), out.address) == 1) {
    out.family = AF_INET6;
    return true;
  }
  return false;
}

bool FromSockaddr(const sockaddr_storage& s, Endpoint& out) {
  if (s.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(s);
    out.family = AF_INET;
    std::memcpy(out.address, &in.sin_addr, 4);
    out.port = ntohs(in.sin_port);
    return true;
  }
  if (s.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(s);
    out.family = AF_INET6;
    std::memcpy(out.address, &in6.sin6_addr, 16);
    out.port = ntohs(in6.sin6_port);
    return true;
  }
  return false;
}

bool Same(const Endpoint& a, const Endpoint& b) {
  return a.family == b.family && a.port == b.port &&
         std::memcmp(a.address, b.address, a.family == AF_INET ? 4 : 16) == 0;
}

bool Matches(int fd, const Endpoint& local, const Endpoint& peer) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  sockaddr_storage s{};
  socklen_t len = sizeof(s);
  Endpoint e;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&s), &len) != 0 ||
      !FromSockaddr(s, e) || !Same(e, local)) {
    return false;
  }
  len = sizeof(s);
  return getpeername(fd, reinterpret_cast<sockaddr*>(&s), &len) == 0 &&
         FromSockaddr(s, e) && Same(e, peer);
}

}  // namespace

absl::StatusOr<ConnectionProbe> ConnectionProbe::Find(
    absl::string_view local_addr, int local_port, absl::string_view peer_addr,
    int peer_port) {
  Endpoint local, peer;
  if (!ParseEndpoint(local_addr, local_port, local) ||
      !ParseEndpoint(peer_addr, peer_port, peer)) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a numeric endpoint pair: ", local_addr, ":",
                     local_port, " <- ", peer_addr, ":", peer_port));
  }
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) {
    return absl::NotFoundError("cannot list /proc/self/fd");
  }
  int found = -1;
  while (const dirent* entry = readdir(dir)) {
    int fd = -1;
    if (!absl::SimpleAtoi(entry->d_name, &fd) || fd == dirfd(dir)) continue;
    if (Matches(fd, local, peer)) {
      found = fd;
      break;
    }
  }
  closedir(dir);
  if (found < 0) {
    return absl::NotFoundError(absl::StrCat("no socket ", local_addr, ":",
                                            local_port, " <- ", peer_addr, ":",
                                            peer_port));
  }
  return ConnectionProbe(found);
}

bool ConnectionProbe::PeerClosed() const {
  pollfd p{};
  p.fd = fd_;
  p.events = POLLIN | POLLRDHUP;
  if (poll(&p, 1, 0) < 0) return false;
  // The peer shut its side (FIN), possibly after bytes still queued (a TLS
  // close_notify alert).
  if ((p.revents & (POLLERR | POLLHUP | POLLNVAL | POLLRDHUP)) != 0) {
    return true;
  }
  if ((p.revents & POLLIN) == 0) return false;
  char byte;
  const ssize_t n = recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 ||
         (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

}  // namespace mneme
