// ConnectionProbe over real loopback sockets: it finds the accepted socket
// by its endpoints, sees a live peer as live (also with unread bytes, which
// it leaves queued), and a peer that closed as gone.

#include "common/connection_probe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace mneme {
namespace {

int Port(int fd, bool peer) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  const int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
                      : getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  EXPECT_EQ(rc, 0);
  return ntohs(a.sin_port);
}

TEST(ConnectionProbe, FindsTheSocketAndSeesThePeerGo) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
            0);
  ASSERT_EQ(listen(listener, 4), 0);
  const int port = Port(listener, false);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
            0);
  const int server = accept(listener, nullptr, nullptr);
  ASSERT_GE(server, 0);
  const int client_port = Port(client, false);

  absl::StatusOr<ConnectionProbe> probe =
      ConnectionProbe::Find("127.0.0.1", port, "127.0.0.1", client_port);
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_EQ(probe->fd(), server);
  EXPECT_FALSE(probe->PeerClosed());

  // Unread bytes: still live, and the bytes stay for the server.
  ASSERT_EQ(send(client, "x", 1, 0), 1);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(probe->PeerClosed());
  char byte = 0;
  ASSERT_EQ(recv(server, &byte, 1, 0), 1);
  EXPECT_EQ(byte, 'x');

  close(client);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(probe->PeerClosed());

  // Another endpoint pair, or not an address.
  EXPECT_EQ(
      ConnectionProbe::Find("127.0.0.1", port, "127.0.0.1", 1).status().code(),
      absl::StatusCode::kNotFound);
  EXPECT_EQ(ConnectionProbe::Find("localhost", port, "127.0.0.1", client_port)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  close(server);
  close(listener);
}

}  // namespace
}  // namespace mneme
