// GroupMembership over real Gloo groups (two ranks on threads, one
// in-memory rendezvous store per generation): no group before Join, a
// working group after it, a broken group after a peer left, and the same
// objects working again in a new generation.

#include "gpu/comm/group_membership.h"

#include <cstdint>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpu/comm/gloo_communicator.h"
#include "gpu/comm/in_memory_rendezvous_store.h"
#include "gtest/gtest.h"

namespace mneme::gpu {
namespace {

// One store per generation, shared by the ranks of a test.
class Stores {
 public:
  InMemoryRendezvousStore& For(int64_t generation) {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<InMemoryRendezvousStore>& s = stores_[generation];
    if (s == nullptr) s = *InMemoryRendezvousStore::Create({});
    return *s;
  }

 private:
  absl::Mutex mu_;
  std::map<int64_t, std::unique_ptr<InMemoryRendezvousStore>> stores_
      ABSL_GUARDED_BY(mu_);
};

std::unique_ptr<GroupMembership> Member(int rank, Stores& stores,
                                        std::vector<int64_t>* formed) {
  auto m = GroupMembership::Create(
      rank, 2,
      [rank, &stores, formed](
          int64_t generation) -> absl::StatusOr<std::unique_ptr<Communicator>> {
        if (formed != nullptr) formed->push_back(generation);
        GlooCommunicatorOptions o;
        o.rank = rank;
        o.size = 2;
        o.timeout = absl::Seconds(5);
        absl::StatusOr<std::unique_ptr<GlooCommunicator>> c =
            GlooCommunicator::Create(o, stores.For(generation));
        if (!c.ok()) return c.status();
        return std::unique_ptr<Communicator>(*std::move(c));
      });
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

// Joins `generation` on both members at once.
void JoinBoth(GroupMembership& a, GroupMembership& b, int64_t generation) {
  absl::Status sa, sb;
  std::thread t([&] { sb = b.Join(generation); });
  sa = a.Join(generation);
  t.join();
  ASSERT_TRUE(sa.ok()) << sa;
  ASSERT_TRUE(sb.ok()) << sb;
}

// AllReduceSum of {rank + 1} on both members.
void ExpectSum(GroupMembership& a, GroupMembership& b) {
  float va = 1, vb = 2;
  absl::Status sa, sb;
  std::thread t([&] { sb = b.AllReduceSum(&vb, 1); });
  sa = a.AllReduceSum(&va, 1);
  t.join();
  ASSERT_TRUE(sa.ok()) << sa;
  ASSERT_TRUE(sb.ok()) << sb;
  EXPECT_EQ(va, 3);
  EXPECT_EQ(vb, 3);
}

TEST(GroupMembership, RefusesBadArguments) {
  auto factory = [](int64_t) -> absl::StatusOr<std::unique_ptr<Communicator>> {
    return absl::InternalError("unused");
  };
  EXPECT_EQ(GroupMembership::Create(2, 2, factory).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GroupMembership::Create(0, 0, factory).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GroupMembership::Create(0, 2, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto m = GroupMembership::Create(0, 2, factory);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)->Join(0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*m)->Join(-3).code(), absl::StatusCode::kInvalidArgument);
}

TEST(GroupMembership, NoCollectivesBeforeJoin) {
  Stores stores;
  std::unique_ptr<GroupMembership> m = Member(0, stores, nullptr);
  EXPECT_FALSE(m->in_group());
  EXPECT_EQ(m->generation(), 0);
  float v = 1;
  EXPECT_EQ(m->AllReduceSum(&v, 1).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(m->Barrier().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(m->rank(), 0);
  EXPECT_EQ(m->size(), 2);
}

TEST(GroupMembership, FactoryErrorLeavesNoGroup) {
  auto m = GroupMembership::Create(
      1, 2, [](int64_t) -> absl::StatusOr<std::unique_ptr<Communicator>> {
        return absl::DeadlineExceededError("rank 0 never came");
      });
  ASSERT_TRUE(m.ok());
  const absl::Status st = (*m)->Join(4);
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(st.message().find("generation 4"), absl::string_view::npos) << st;
  EXPECT_FALSE((*m)->in_group());
  EXPECT_EQ((*m)->generation(), 4);
  float v = 0;
  EXPECT_EQ((*m)->AllReduceSum(&v, 1).code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(GroupMembership, HealsInANewGenerationAfterAPeerLeft) {
  Stores stores;
  std::vector<int64_t> formed0;
  std::unique_ptr<GroupMembership> a = Member(0, stores, &formed0);
  std::unique_ptr<GroupMembership> b = Member(1, stores, nullptr);
  JoinBoth(*a, *b, 1);
  EXPECT_TRUE(a->in_group());
  ExpectSum(*a, *b);
  // Joining the generation it is in changes nothing (no new rendezvous).
  ASSERT_TRUE(a->Join(1).ok());
  EXPECT_EQ(formed0, std::vector<int64_t>({1}));
  const int64_t calls = a->stats().calls;
  EXPECT_GT(calls, 0);

  // Rank 1 goes away (its connections close, as when its process dies).
  b->Leave(absl::UnavailableError("restarting"));
  EXPECT_FALSE(b->in_group());
  float v = 1;
  const absl::Status broken = a->AllReduceSum(&v, 1);
  EXPECT_FALSE(broken.ok());
  EXPECT_FALSE(a->in_group());
  // Broken stays broken until the next Join.
  EXPECT_EQ(a->Barrier().code(), broken.code());

  // Both join generation 2: the same objects work again.
  JoinBoth(*a, *b, 2);
  EXPECT_TRUE(a->in_group());
  EXPECT_TRUE(b->in_group());
  EXPECT_EQ(a->generation(), 2);
  ExpectSum(*a, *b);
  EXPECT_EQ(formed0, std::vector<int64_t>({1, 2}));
  // Statistics add up over the generations.
  EXPECT_GT(a->stats().calls, calls);
}

TEST(GroupMembership, ArgumentErrorsDoNotBreakTheGroup) {
  Stores stores;
  std::unique_ptr<GroupMembership> a = Member(0, stores, nullptr);
  std::unique_ptr<GroupMembership> b = Member(1, stores, nullptr);
  JoinBoth(*a, *b, 7);
  float v = 0;
  EXPECT_EQ(a->AllReduceSum(&v, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(a->in_group());
  ExpectSum(*a, *b);
}

}  // namespace
}  // namespace mneme::gpu
