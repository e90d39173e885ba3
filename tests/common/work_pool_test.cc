#include "common/work_pool.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace mneme {
namespace {

TEST(WorkPoolTest, RejectsBadOptions) {
  EXPECT_EQ(WorkPool::Create(0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WorkPool::Create(1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(WorkPoolTest, RunsEveryQueuedTaskBeforeDestruction) {
  std::atomic<int> ran = 0;
  {
    std::unique_ptr<WorkPool> pool = *WorkPool::Create(3, 1000);
    for (int i = 0; i < 500; ++i) {
      ASSERT_TRUE(pool->TrySchedule([&ran] { ran.fetch_add(1); }));
    }
  }
  EXPECT_EQ(ran.load(), 500);
}

TEST(WorkPoolTest, RefusesPastTheQueueBoundWithoutBlocking) {
  std::unique_ptr<WorkPool> pool = *WorkPool::Create(1, 2);
  absl::Notification started, release;
  ASSERT_TRUE(pool->TrySchedule([&] {
    started.Notify();
    release.WaitForNotification();
  }));
  started.WaitForNotification();  // The worker is busy; the queue is empty.
  EXPECT_TRUE(pool->TrySchedule([] {}));
  EXPECT_TRUE(pool->TrySchedule([] {}));
  EXPECT_FALSE(pool->TrySchedule([] {}));
  EXPECT_EQ(pool->queued(), 2);
  release.Notify();
}

}  // namespace
}  // namespace mneme
