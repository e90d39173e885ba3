#include "gpu/comm/in_memory_rendezvous_store.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mneme::gpu {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<InMemoryRendezvousStore> MakeStore(
    const InMemoryRendezvousStoreOptions& options = {}) {
  auto store = InMemoryRendezvousStore::Create(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return *std::move(store);
}

// Captures a StartGet result.
struct Result {
  absl::Notification done;
  absl::StatusOr<std::vector<std::string>> values;

  InMemoryRendezvousStore::GetCallback Callback() {
    return [this](absl::StatusOr<std::vector<std::string>> v) {
      values = std::move(v);
      done.Notify();
    };
  }
};

// Waits (bounded by the test's own timeout) until `n` gets are waiting.
void AwaitWaiting(const InMemoryRendezvousStore& store, int64_t n) {
  while (store.waiting_gets() != n) absl::SleepFor(absl::Milliseconds(1));
}

TEST(InMemoryRendezvousStoreTest, GetReturnsValuesInKeyOrder) {
  auto store = MakeStore();
  ASSERT_TRUE(store->Set("a", "1").ok());
  ASSERT_TRUE(store->Set("b", std::string("\0x\0", 3)).ok());
  auto values = store->Get({"b", "a", "b"}, absl::ZeroDuration());
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre(std::string("\0x\0", 3), "1",
                                   std::string("\0x\0", 3)));
}

TEST(InMemoryRendezvousStoreTest, EmptyValueCountsAsSet) {
  auto store = MakeStore();
  ASSERT_TRUE(store->Set("k", "").ok());
  auto values = store->Get({"k"}, absl::ZeroDuration());
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre(""));
}

TEST(InMemoryRendezvousStoreTest, SetReplacesAndAccountsBytes) {
  auto store = MakeStore();
  ASSERT_TRUE(store->Set("key", "12345").ok());
  EXPECT_EQ(store->total_bytes(), 8);
  ASSERT_TRUE(store->Set("key", "1").ok());
  EXPECT_EQ(store->total_bytes(), 4);
  auto values = store->Get({"key"}, absl::ZeroDuration());
  ASSERT_TRUE(values.ok());
  EXPECT_THAT(*values, ElementsAre("1"));
}

TEST(InMemoryRendezvousStoreTest, EraseIfRemovesKeysAndTheirBytes) {
  auto store = MakeStore();
  ASSERT_TRUE(store->Set("g/gen-1/a", "xx").ok());
  ASSERT_TRUE(store->Set("g/gen-1/b", "yy").ok());
  ASSERT_TRUE(store->Set("g/gen-2/a", "zz").ok());
  const int64_t before = store->total_bytes();
  EXPECT_EQ(store->EraseIf([](absl::string_view k) {
    return absl::StartsWith(k, "g/gen-1/");
  }),
            2);
  // Two keys of 9 bytes with values of 2.
  EXPECT_EQ(store->total_bytes(), before - int64_t{22});
  EXPECT_EQ(store->Get({"g/gen-1/a"}, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  auto kept = store->Get({"g/gen-2/a"}, absl::ZeroDuration());
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ((*kept)[0], "zz");
  // An erased key can be set again and wakes its waiters as before.
  ASSERT_TRUE(store->Set("g/gen-1/a", "again").ok());
  EXPECT_EQ(store->EraseIf([](absl::string_view) { return false; }), 0);
}

TEST(InMemoryRendezvousStoreTest, GetWaitsForALaterSet) {
  auto store = MakeStore();
  absl::StatusOr<std::vector<std::string>> values;
  std::thread getter([&] {
    values = store->Get({"x", "y"}, absl::InfiniteDuration());
  });
  AwaitWaiting(*store, 1);
  ASSERT_TRUE(store->Set("y", "why").ok());
  ASSERT_TRUE(store->Set("x", "ex").ok());
  getter.join();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre("ex", "why"));
  EXPECT_EQ(store->waiting_gets(), 0);
}

TEST(InMemoryRendezvousStoreTest, GetTimesOutNamingAMissingKey) {
  auto store = MakeStore();
  ASSERT_TRUE(store->Set("here", "1").ok());
  auto values = store->Get({"here", "gone"}, absl::Milliseconds(50));
  EXPECT_EQ(values.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(values.status().message(), HasSubstr("\"gone\""));
  EXPECT_EQ(store->waiting_gets(), 0);
}

TEST(InMemoryRendezvousStoreTest, ZeroTimeoutDoesNotWait) {
  auto store = MakeStore();
  auto values = store->Get({"missing"}, absl::ZeroDuration());
  EXPECT_EQ(values.status().code(), absl::StatusCode::kDeadlineExceeded);
  values = store->Get({"missing"}, absl::Seconds(-1));
  EXPECT_EQ(values.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(store->waiting_gets(), 0);
}

TEST(InMemoryRendezvousStoreTest, RejectsBadKeysAndValues) {
  InMemoryRendezvousStoreOptions options;
  options.max_key_bytes = 4;
  options.max_value_bytes = 8;
  options.max_keys_per_get = 2;
  auto store = MakeStore(options);
  EXPECT_EQ(store->Set("", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Set("12345", "v").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Set("k", "123456789").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(store->Set("1234", "12345678").ok());
  EXPECT_EQ(store->Get({}, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Get({"a", "b", "c"}, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Get({"a", ""}, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Get({"12345"}, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(InMemoryRendezvousStoreTest, TotalBudgetIsEnforced) {
  InMemoryRendezvousStoreOptions options;
  options.max_total_bytes = 10;
  auto store = MakeStore(options);
  ASSERT_TRUE(store->Set("a", "1234").ok());  // 5 bytes.
  ASSERT_TRUE(store->Set("b", "1234").ok());  // 10 bytes.
  const absl::Status over = store->Set("c", "");
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store->Set("a", "12345").code(),
            absl::StatusCode::kResourceExhausted);
  // Shrinking a value frees budget for another key.
  ASSERT_TRUE(store->Set("a", "").ok());
  EXPECT_TRUE(store->Set("cd", "12").ok());
  EXPECT_EQ(store->total_bytes(), 10);
}

TEST(InMemoryRendezvousStoreTest, WaitingGetsAreBounded) {
  InMemoryRendezvousStoreOptions options;
  options.max_waiting_gets = 1;
  auto store = MakeStore(options);
  Result first;
  store->StartGet({"k"}, absl::InfiniteFuture(), first.Callback());
  Result second;
  store->StartGet({"k"}, absl::InfiniteFuture(), second.Callback());
  ASSERT_TRUE(second.done.HasBeenNotified());
  EXPECT_EQ(second.values.status().code(),
            absl::StatusCode::kResourceExhausted);
  // A get whose keys exist needs no waiting slot.
  ASSERT_TRUE(store->Set("other", "1").ok());
  EXPECT_TRUE(store->Get({"other"}, absl::ZeroDuration()).ok());
  ASSERT_TRUE(store->Set("k", "v").ok());
  ASSERT_TRUE(first.done.HasBeenNotified());
  ASSERT_TRUE(first.values.ok());
  EXPECT_THAT(*first.values, ElementsAre("v"));
}

TEST(InMemoryRendezvousStoreTest, StartGetAnswersAtOnceWhenKeysExist) {
  auto store = MakeStore();
  ASSERT_TRUE(store->Set("k", "v").ok());
  Result result;
  store->StartGet({"k", "k"}, absl::InfiniteFuture(), result.Callback());
  ASSERT_TRUE(result.done.HasBeenNotified());
  ASSERT_TRUE(result.values.ok());
  EXPECT_THAT(*result.values, ElementsAre("v", "v"));
}

TEST(InMemoryRendezvousStoreTest, DuplicateMissingKeysCompleteOnOneSet) {
  auto store = MakeStore();
  Result result;
  store->StartGet({"k", "k"}, absl::InfiniteFuture(), result.Callback());
  EXPECT_FALSE(result.done.HasBeenNotified());
  ASSERT_TRUE(store->Set("k", "v").ok());
  ASSERT_TRUE(result.done.HasBeenNotified());
  ASSERT_TRUE(result.values.ok());
  EXPECT_THAT(*result.values, ElementsAre("v", "v"));
}

TEST(InMemoryRendezvousStoreTest, TimerEndsAsyncGetAtDeadline) {
  auto store = MakeStore();
  Result result;
  store->StartGet({"never"}, absl::Now() + absl::Milliseconds(20),
                  result.Callback());
  result.done.WaitForNotification();
  EXPECT_EQ(result.values.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(store->waiting_gets(), 0);
}

TEST(InMemoryRendezvousStoreTest, CancelGetEndsItOnce) {
  auto store = MakeStore();
  Result result;
  const int64_t id =
      store->StartGet({"k"}, absl::InfiniteFuture(), result.Callback());
  store->CancelGet(id, absl::CancelledError("bye"));
  ASSERT_TRUE(result.done.HasBeenNotified());
  EXPECT_EQ(result.values.status().code(), absl::StatusCode::kCancelled);
  // Neither a second cancel nor the key arriving calls it again (Notify
  // twice would crash).
  store->CancelGet(id, absl::CancelledError("again"));
  ASSERT_TRUE(store->Set("k", "v").ok());
  EXPECT_EQ(store->waiting_gets(), 0);
}

TEST(InMemoryRendezvousStoreTest, DestructionFailsWaitingGets) {
  auto store = MakeStore();
  Result result;
  store->StartGet({"k"}, absl::InfiniteFuture(), result.Callback());
  store.reset();
  ASSERT_TRUE(result.done.HasBeenNotified());
  EXPECT_EQ(result.values.status().code(), absl::StatusCode::kUnavailable);
}

TEST(InMemoryRendezvousStoreTest, ManyThreadsMeet) {
  auto store = MakeStore();
  constexpr int kThreads = 8;
  std::vector<std::string> keys;
  keys.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) keys.push_back(absl::StrCat("rank/", t));
  std::vector<absl::StatusOr<std::vector<std::string>>> results(kThreads);
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ASSERT_TRUE(store->Set(keys[t], absl::StrCat("addr-", t)).ok());
      results[t] = store->Get(keys, absl::InfiniteDuration());
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(results[t].ok()) << results[t].status();
    for (int q = 0; q < kThreads; ++q) {
      EXPECT_EQ((*results[t])[q], absl::StrCat("addr-", q));
    }
  }
}

TEST(InMemoryRendezvousStoreTest, CreateRejectsBadOptions) {
  InMemoryRendezvousStoreOptions options;
  options.max_value_bytes = 0;
  auto store = InMemoryRendezvousStore::Create(options);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(store.status().message(), HasSubstr("max_value_bytes"));
  options = {};
  options.max_waiting_gets = 0;
  EXPECT_EQ(InMemoryRendezvousStore::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mneme::gpu
