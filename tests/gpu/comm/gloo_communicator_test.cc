// GlooCommunicator with its ranks as threads of this process, meeting
// through an InMemoryRendezvousStore.
#include "gpu/comm/gloo_communicator.h"

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gpu/comm/in_memory_rendezvous_store.h"
#include "gtest/gtest.h"
#include "tests/gpu/comm/collective_checks.h"

// LeakSanitizer (--config=asan): Debian's libgloo throws from
// CreateDeviceAttr after getifaddrs / getaddrinfo without freeing them when
// an address cannot be bound, a path these tests take on purpose.
extern "C" const char* __lsan_default_suppressions() {
  return "leak:gloo::transport::tcp::CreateDeviceAttr\n";
}

namespace mneme::gpu {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<InMemoryRendezvousStore> MakeStore(
    const InMemoryRendezvousStoreOptions& options = {}) {
  auto store = InMemoryRendezvousStore::Create(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return *std::move(store);
}

GlooCommunicatorOptions Options(int rank, int size,
                                absl::Duration timeout = absl::Seconds(60)) {
  GlooCommunicatorOptions options;
  options.rank = rank;
  options.size = size;
  options.timeout = timeout;
  return options;
}

// Creates `size` communicators concurrently (Create blocks until the group
// has assembled).
std::vector<std::unique_ptr<GlooCommunicator>> MakeGroup(RendezvousStore& store,
                                                         int size) {
  std::vector<std::unique_ptr<GlooCommunicator>> comms(size);
  std::vector<std::thread> threads;
  threads.reserve(size);
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      auto comm = GlooCommunicator::Create(Options(r, size), store);
      ASSERT_TRUE(comm.ok()) << comm.status();
      comms[r] = *std::move(comm);
    });
  }
  for (std::thread& t : threads) t.join();
  return comms;
}

// Runs body(rank) on one thread per rank and returns the statuses.
std::vector<absl::Status> OnEveryRank(
    int size, const std::function<absl::Status(int)>& body) {
  std::vector<absl::Status> statuses(size);
  std::vector<std::thread> threads;
  threads.reserve(size);
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] { statuses[r] = body(r); });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

class GlooGroupTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooGroupTest, EveryCollectiveIsExact) {
  const int size = GetParam();
  auto store = MakeStore();
  auto comms = MakeGroup(*store, size);
  ASSERT_EQ(comms.size(), static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    ASSERT_NE(comms[r], nullptr);
    EXPECT_EQ(comms[r]->rank(), r);
    EXPECT_EQ(comms[r]->size(), size);
  }
  const std::vector<absl::Status> statuses = OnEveryRank(size, [&](int r) {
    return testing::RunCollectiveChecks(*comms[r], {1, 7, 1000, 1 << 20});
  });
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  }
  // Per count: all-reduce, all-gather, reduce-scatter, one broadcast per
  // root; then one barrier.
  const CommStats stats = comms[0]->stats();
  EXPECT_EQ(stats.calls, 4 * (3 + size) + 1);
  const int64_t floats = (1 + 7 + 1000 + (1 << 20));
  // All-reduce + all-gather contribute count floats, reduce-scatter
  // size * count, broadcast count when this rank is the root.
  EXPECT_EQ(stats.bytes, floats * sizeof(float) * (2 + size + 1));
  EXPECT_GT(stats.time, absl::ZeroDuration());
}

TEST_P(GlooGroupTest, ZeroCountIsANoOp) {
  const int size = GetParam();
  auto store = MakeStore();
  auto comms = MakeGroup(*store, size);
  const std::vector<absl::Status> statuses = OnEveryRank(size, [&](int r) {
    Communicator& c = *comms[r];
    if (absl::Status s = c.AllReduceSum(nullptr, 0); !s.ok()) return s;
    if (absl::Status s = c.AllGather(nullptr, 0, nullptr); !s.ok()) return s;
    if (absl::Status s = c.ReduceScatterSum(nullptr, 0, nullptr); !s.ok()) {
      return s;
    }
    if (absl::Status s = c.Broadcast(nullptr, 0, 0); !s.ok()) return s;
    return testing::RunCollectiveChecks(c, {3});
  });
  for (const absl::Status& s : statuses) EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Sizes, GlooGroupTest, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "Ranks" + std::to_string(info.param);
                         });

TEST(GlooCommunicatorTest, BadArgumentsDoNotBreakIt) {
  auto store = MakeStore();
  auto comms = MakeGroup(*store, 2);
  const std::vector<absl::Status> statuses = OnEveryRank(2, [&](int r) {
    Communicator& c = *comms[r];
    float x = 1;
    EXPECT_EQ(c.AllReduceSum(&x, -1).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.AllReduceSum(nullptr, 4).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.AllGather(&x, 1, nullptr).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.ReduceScatterSum(nullptr, 1, &x).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.Broadcast(&x, 1, 2).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.Broadcast(&x, 1, -1).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.AllReduceSum(&x, int64_t{1} << 62).code(),
              absl::StatusCode::kInvalidArgument);
    return testing::RunCollectiveChecks(c, {5});
  });
  for (const absl::Status& s : statuses) EXPECT_TRUE(s.ok()) << s;
}

TEST(GlooCommunicatorTest, SilentPeerGivesDeadlineExceededAndBreaksIt) {
  auto store = MakeStore();
  std::vector<std::unique_ptr<GlooCommunicator>> comms(2);
  std::vector<std::thread> threads;
  threads.reserve(2);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto comm = GlooCommunicator::Create(
          Options(r, 2, absl::Milliseconds(300)), *store);
      ASSERT_TRUE(comm.ok()) << comm.status();
      comms[r] = *std::move(comm);
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_NE(comms[0], nullptr);
  // Rank 1 never joins the all-reduce.
  std::vector<float> data(16, 1.0f);
  const absl::Status first = comms[0]->AllReduceSum(data.data(), 16);
  EXPECT_EQ(first.code(), absl::StatusCode::kDeadlineExceeded) << first;
  // Broken: the same error, without communicating.
  EXPECT_EQ(comms[0]->Barrier(), first);
  EXPECT_EQ(comms[0]->AllGather(data.data(), 1, data.data()), first);
  EXPECT_EQ(comms[0]->AllReduceSum(data.data(), -1), first);
}

TEST(GlooCommunicatorTest, MissingRankIsDeadlineExceeded) {
  auto store = MakeStore();
  auto comm =
      GlooCommunicator::Create(Options(0, 2, absl::Milliseconds(200)), *store);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(comm.status().message(), HasSubstr("rendezvous of rank 0 of 2"));
}

TEST(GlooCommunicatorTest, StoreErrorsKeepTheirCode) {
  InMemoryRendezvousStoreOptions options;
  options.max_value_bytes = 1;
  auto store = MakeStore(options);
  auto comm = GlooCommunicator::Create(Options(0, 2), *store);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument);
  options = {};
  options.max_total_bytes = 8;
  store = MakeStore(options);
  comm = GlooCommunicator::Create(Options(1, 2), *store);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(GlooCommunicatorTest, CreateRejectsBadOptions) {
  auto store = MakeStore();
  EXPECT_EQ(GlooCommunicator::Create(Options(0, 0), *store).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GlooCommunicator::Create(Options(2, 2), *store).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GlooCommunicator::Create(Options(-1, 2), *store).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      GlooCommunicator::Create(Options(0, 1, absl::ZeroDuration()), *store)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  GlooCommunicatorOptions options = Options(0, 1);
  options.hostname = "192.0.2.1";  // TEST-NET-1: not an address of ours.
  auto comm = GlooCommunicator::Create(options, *store);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(comm.status().message(), HasSubstr("192.0.2.1"));
  options = Options(0, 1);
  options.interface = "no-such-if0";
  comm = GlooCommunicator::Create(options, *store);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(comm.status().message(), HasSubstr("no-such-if0"));
}

}  // namespace
}  // namespace mneme::gpu
