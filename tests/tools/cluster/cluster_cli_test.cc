// `mneme cluster up` end to end with the real daemons: it serves (health
// SERVING, a greedy generation), stops cleanly on SIGTERM (exit 0, every
// daemon gone, the temporary workdir removed), refuses a bad --bin-dir with
// the paths it tried, and brings a killed worker back alone (the other rank
// keeps its process and weights; the same generation succeeds again).

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "proto/serving/v1/serving.grpc.pb.h"
#include "tests/testing/command.h"
#include "tests/testing/subprocess.h"

namespace mneme {
namespace {

using ::testing::HasSubstr;
namespace sv1 = ::mneme::serving::v1;

constexpr absl::Duration kStartTimeout = absl::Seconds(300);

// A daemon as the launcher reported it: "<name> pid <P> at <HOST:PORT>".
struct Reported {
  std::string name;
  pid_t pid = -1;
  std::string address;
};

// Every daemon start line in `out`, in order.
std::vector<Reported> ReportedDaemons(const std::string& out) {
  static const std::regex kLine(
      R"(^(engram_store|worker \d+|coordinator) pid (\d+) at (\S+))");
  std::vector<Reported> all;
  for (const std::string& line : mneme::testing::NonEmptyLines(out)) {
    std::smatch m;
    if (std::regex_search(line, m, kLine)) {
      all.push_back({m[1], static_cast<pid_t>(std::stol(m[2])), m[3]});
    }
  }
  return all;
}

// Whether something accepts TCP connections on HOST:PORT (IPv4).
bool Accepts(const std::string& address) {
  const size_t colon = address.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port =
      htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const bool ok =
      connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) == 0;
  close(fd);
  return ok;
}

bool Gone(pid_t pid) { return kill(pid, 0) == -1 && errno == ESRCH; }

grpc::health::v1::HealthCheckResponse::ServingStatus Health(
    const std::string& address) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status st = stub->Check(&ctx, {}, &response);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return response.status();
}

struct Generation {
  grpc::Status status;
  std::vector<int64_t> tokens;
  sv1::FinishReason finish = sv1::FINISH_REASON_UNSPECIFIED;
};

// A greedy generation of 4 tokens from a fixed prompt.
Generation Generate(const std::string& address) {
  auto stub = sv1::Serving::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  sv1::GenerateRequest request;
  for (int64_t t : {5, 6, 7, 8, 9}) request.add_token_ids(t);
  request.set_max_new_tokens(4);
  request.set_ignore_eos(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto reader = stub->Generate(&ctx, request);
  Generation g;
  sv1::GenerateResponse m;
  while (reader->Read(&m)) {
    g.tokens.insert(g.tokens.end(), m.token_ids().begin(), m.token_ids().end());
    if (m.finish_reason() != sv1::FINISH_REASON_UNSPECIFIED) {
      g.finish = m.finish_reason();
    }
  }
  g.status = reader->Finish();
  return g;
}

std::unique_ptr<mneme::testing::Subprocess> StartCluster(
    const std::vector<std::string>& flags,
    const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> argv = {
      mneme::testing::RunfilePath("mneme/tools/mneme"), "cluster", "up",
      "--kv-cache-bytes=16777216"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  absl::StatusOr<std::unique_ptr<mneme::testing::Subprocess>> p =
      mneme::testing::Subprocess::Start(argv, env);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : nullptr;
}

TEST(ClusterCliTest, ServesAndStopsCleanlyOnSigterm) {
  const std::string tmp = mneme::testing::MakeTempDir("tmp");
  std::unique_ptr<mneme::testing::Subprocess> cluster =
      StartCluster({"--tp=2"}, {{"TMPDIR", tmp}});
  ASSERT_NE(cluster, nullptr);
  absl::StatusOr<std::string> line =
      cluster->WaitForStdoutLine("coordinator at ", kStartTimeout);
  ASSERT_TRUE(line.ok()) << line.status();
  const std::string address =
      line->substr(std::string("coordinator at ").size());
  EXPECT_EQ(Health(address), grpc::health::v1::HealthCheckResponse::SERVING);
  const Generation g = Generate(address);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.tokens.size(), 4u);
  EXPECT_EQ(g.finish, sv1::FINISH_REASON_LENGTH);

  const std::vector<Reported> daemons = ReportedDaemons(cluster->Stdout());
  ASSERT_EQ(daemons.size(), 4u) << cluster->Stdout();
  EXPECT_EQ(daemons[0].name, "engram_store");
  EXPECT_EQ(daemons[1].name, "worker 0");
  EXPECT_EQ(daemons[2].name, "worker 1");
  EXPECT_EQ(daemons[3].name, "coordinator");
  EXPECT_EQ(daemons[3].address, address);
  // The workdir is a new directory under $TMPDIR.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(tmp),
                          std::filesystem::directory_iterator()),
            1);

  cluster->Signal(SIGTERM);
  absl::StatusOr<int> code = cluster->Wait(absl::Seconds(120));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << cluster->Stderr();
  for (const Reported& d : daemons) {
    EXPECT_TRUE(Gone(d.pid)) << d.name;
    EXPECT_FALSE(Accepts(d.address)) << d.name << " " << d.address;
  }
  EXPECT_TRUE(std::filesystem::is_empty(tmp));
}

TEST(ClusterCliTest, BadBinDirIsAClearError) {
  const std::string bin = mneme::testing::MakeTempDir("bin") + "/nothing";
  const mneme::testing::CommandResult r =
      mneme::testing::RunMneme({"cluster", "up", "--bin-dir", bin});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot find the daemon binaries"));
  EXPECT_THAT(r.err, HasSubstr("--bin-dir"));
  EXPECT_THAT(r.err, HasSubstr(bin + "/mneme_worker"));
  EXPECT_EQ(r.out, "");
}

TEST(ClusterCliTest, BadFlagsAreClearErrors) {
  mneme::testing::CommandResult r =
      mneme::testing::RunMneme({"cluster", "up", "--tp", "2", "--dcp", "3"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("--dcp=3"));
  r = mneme::testing::RunMneme({"cluster", "up", "--comm-timeout", "soon"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("--comm-timeout=soon"));
  r = mneme::testing::RunMneme({"cluster", "down"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("mneme cluster up"));
}

TEST(ClusterCliTest, AKilledWorkerIsRestartedAndTheClusterServesAgain) {
  const std::string workdir = mneme::testing::MakeTempDir("work");
  std::unique_ptr<mneme::testing::Subprocess> cluster =
      StartCluster({"--tp=2", "--comm-timeout=5s", "--workdir=" + workdir});
  ASSERT_NE(cluster, nullptr);
  absl::StatusOr<std::string> line =
      cluster->WaitForStdoutLine("coordinator at ", kStartTimeout);
  ASSERT_TRUE(line.ok()) << line.status();
  const std::string address =
      line->substr(std::string("coordinator at ").size());
  const Generation before = Generate(address);
  ASSERT_TRUE(before.status.ok()) << before.status.error_message();

  std::vector<Reported> daemons = ReportedDaemons(cluster->Stdout());
  ASSERT_EQ(daemons.size(), 4u);
  ASSERT_EQ(daemons[2].name, "worker 1");
  const Reported killed = daemons[2];
  ASSERT_EQ(kill(killed.pid, SIGKILL), 0);

  ASSERT_EQ(daemons[1].name, "worker 0");
  const Reported other = daemons[1];
  // A new rank 1 on the same port; rank 0 stays.
  Reported restarted;
  while (restarted.pid < 0) {
    for (const Reported& d : ReportedDaemons(cluster->Stdout())) {
      if (d.name == "worker 1" && d.pid != killed.pid) restarted = d;
    }
    ASSERT_FALSE(cluster->Wait(absl::ZeroDuration()).ok())
        << "the launcher exited: " << cluster->Stderr();
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(restarted.address, killed.address);
  EXPECT_TRUE(Gone(killed.pid));

  // Serving again: requests may be refused while the group re-forms.
  Generation after;
  const absl::Time deadline = absl::Now() + absl::Seconds(180);
  do {
    after = Generate(address);
    if (!after.status.ok()) absl::SleepFor(absl::Milliseconds(200));
  } while (!after.status.ok() &&
           after.status.error_code() == grpc::StatusCode::UNAVAILABLE &&
           absl::Now() < deadline);
  ASSERT_TRUE(after.status.ok()) << after.status.error_message() << "\n"
                                 << cluster->Stdout();
  EXPECT_EQ(after.tokens, before.tokens);
  EXPECT_EQ(Health(address), grpc::health::v1::HealthCheckResponse::SERVING);
  for (const Reported& d : ReportedDaemons(cluster->Stdout())) {
    if (d.name == "worker 0") {
      EXPECT_EQ(d.pid, other.pid);
    }
  }

  cluster->Signal(SIGTERM);
  absl::StatusOr<int> code = cluster->Wait(absl::Seconds(120));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << cluster->Stderr();
  for (const Reported& d : ReportedDaemons(cluster->Stdout())) {
    EXPECT_TRUE(Gone(d.pid)) << d.name << " pid " << d.pid;
  }
  // A given --workdir is kept, with the logs.
  EXPECT_TRUE(std::filesystem::exists(workdir + "/worker1.log"));
  EXPECT_TRUE(std::filesystem::exists(workdir + "/coordinator.log"));
}

}  // namespace
}  // namespace mneme
