#include "common/host_port.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace mneme {

std::string HostPort::ToString() const {
  if (host.find(':') != std::string::npos) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view text,
                                       absl::string_view what) {
  const size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "=", text, ": expected HOST:PORT"));
  }
  absl::string_view host = text.substr(0, colon);
  const absl::string_view port_text = text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, "=", text, ": IPv6 addresses must be written [ADDR]:PORT"));
  }
  if (host.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "=", text, ": empty host"));
  }
  int port = 0;
  if (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "=", text, ": port must be a number in 0..65535"));
  }
  return HostPort{std::string(host), port};
}

absl::Status CheckBindable(const HostPort& address, absl::string_view what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  const std::string port = std::to_string(address.port);
  const int rc =
      getaddrinfo(address.host.c_str(), port.c_str(), &hints, &result);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", what, "=",
                                               address.ToString(), ": ",
                                               gai_strerror(rc)));
  }
  std::string last_error = "no usable address";
  bool bound = false;
  for (addrinfo* ai = result; ai != nullptr && !bound; ai = ai->ai_next) {
    const int fd =
        socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    // gRPC sets SO_REUSEADDR too: mirror it so the check agrees with it.
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      bound = true;
    } else {
      last_error = std::strerror(errno);
    }
    close(fd);
  }
  freeaddrinfo(result);
  if (!bound) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", what, "=", address.ToString(), ": ", last_error));
  }
  return absl::OkStatus();
}

}  // namespace mneme
