#include "tests/testing/notify_socket.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstring>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace mneme::testing {

NotifySocket::NotifySocket() {
  static std::atomic<int> counter{0};
  // Tests in PID namespaces (Bazel's sandbox) share pids but not the
  // abstract socket namespace: a random part keeps concurrent tests apart.
  absl::BitGen gen;
  name_ = absl::StrCat("mneme-notify-test-", getpid(), "-", counter++, "-",
                       absl::Uniform<uint64_t>(gen));
  fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  // Abstract socket: a leading NUL, no file.
  std::memcpy(addr.sun_path + 1, name_.data(), name_.size());
  const socklen_t len = offsetof(sockaddr_un, sun_path) + 1 + name_.size();
  bound_ = bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) == 0;
  timeval timeout{};
  timeout.tv_usec = 100000;
  setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
}

NotifySocket::~NotifySocket() { close(fd_); }

bool NotifySocket::WaitFor(const std::string& want, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  char buf[4096];
  while (absl::Now() < deadline) {
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) continue;
    for (absl::string_view line :
         absl::StrSplit(absl::string_view(buf, n), '\n')) {
      received_.emplace_back(line);
      if (line == want) return true;
    }
  }
  return false;
}

int NotifySocket::Count(const std::string& message) const {
  int count = 0;
  for (const std::string& m : received_) count += m == message;
  return count;
}

}  // namespace mneme::testing
