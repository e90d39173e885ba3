// UringRowReader specifics: option validation, buffer and queue limits that
// force the arena to wrap, extents longer than the buffer, a single ring
// shared by many callers, and no thread growth.

#include "engram_store/io/uring_row_reader.h"

#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "engram_store/io/row_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engram_store/io/io_test_util.h"

namespace mneme::engram {
namespace {

using ::mneme::engram::testing::CountIoUringWorkers;
using ::mneme::engram::testing::SpanBatch;
using ::mneme::engram::testing::TempPath;
using ::mneme::engram::testing::WaitForThreadCount;
using ::mneme::engram::testing::WriteRandomFile;
using ::testing::HasSubstr;

constexpr uint64_t kFileSize = 2 * 1024 * 1024 + 333;

// Creates a reader, or skips the test where io_uring is not allowed. `var`
// names the variable it declares, so it cannot be parenthesized.
#define CREATE_OR_SKIP(var, options)                               \
  absl::StatusOr<std::unique_ptr<UringRowReader>> var##_or =       \
      UringRowReader::Create(options);                             \
  if (absl::IsUnavailable(var##_or.status())) {                    \
    GTEST_SKIP() << "io_uring unavailable: " << var##_or.status(); \
  }                                                                \
  ASSERT_TRUE(var##_or.ok()) << var##_or.status();                 \
  auto var = *std::move(var##_or)  // NOLINT(bugprone-macro-parentheses)

class UringRowReaderTest : public ::testing::TestWithParam<OpenMode> {
 protected:
  void SetUp() override {
    path_ = TempPath(absl::StrCat("uring_", OpenModeName(GetParam()), ".bin"));
    ASSERT_TRUE(WriteRandomFile(path_, kFileSize, 5).ok());
    file_ = *RowFile::Open(path_, GetParam());
  }

  SpanBatch RandomRows(int n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    SpanBatch batch;
    for (int i = 0; i < n; ++i) {
      batch.Add(file_.get(), rng() % (kFileSize - 264), 264);
    }
    batch.Finish();
    return batch;
  }

  std::string path_;
  std::unique_ptr<RowFile> file_;
};

TEST_P(UringRowReaderTest, TinyQueueAndBufferStillReadEverything) {
  UringRowReaderOptions options;
  options.rings = 1;
  options.queue_depth = 1;
  options.coalesce.max_read_bytes = 8192;
  options.buffer_bytes = 16384;
  CREATE_OR_SKIP(reader, options);
  SpanBatch batch = RandomRows(2000, 1);
  ASSERT_TRUE(reader->Read(batch.spans(), absl::InfiniteFuture()).ok());
  EXPECT_EQ(batch.Verify(), "");
}

TEST_P(UringRowReaderTest, ExtentLongerThanTheBuffer) {
  UringRowReaderOptions options;
  options.rings = 1;
  options.queue_depth = 4;
  options.coalesce.max_read_bytes = 8192;
  options.buffer_bytes = 16384;
  CREATE_OR_SKIP(reader, options);
  // 1000 touching rows: one 264 KB extent, 33 ops, over a 16 KiB buffer.
  SpanBatch batch;
  for (int i = 0; i < 1000; ++i) batch.Add(file_.get(), 5 + 264 * i, 264);
  batch.Finish();
  ASSERT_TRUE(reader->Read(batch.spans(), absl::InfiniteFuture()).ok());
  EXPECT_EQ(batch.Verify(), "");
  // The ring's buffer shrinks back for the next, ordinary read.
  SpanBatch next = RandomRows(100, 2);
  ASSERT_TRUE(reader->Read(next.spans(), absl::InfiniteFuture()).ok());
  EXPECT_EQ(next.Verify(), "");
}

TEST_P(UringRowReaderTest, OneRingManyCallersNoThreadGrowth) {
  UringRowReaderOptions options;
  options.rings = 1;
  options.queue_depth = 16;
  options.max_kernel_workers = 2;
  ASSERT_EQ(WaitForThreadCount(1), 1);  // The test's main thread.
  CREATE_OR_SKIP(reader, options);
  const int threads_before = 1;
  std::vector<std::string> errors(4);
  {
    std::vector<std::thread> callers;
    callers.reserve(4);
    for (int t = 0; t < 4; ++t) {
      callers.emplace_back([&, t] {
        for (int round = 0; round < 10; ++round) {
          SpanBatch batch = RandomRows(300, 10 * t + round);
          const absl::Status status =
              reader->Read(batch.spans(), absl::InfiniteFuture());
          if (!status.ok()) {
            errors[t] = status.ToString();
          } else if (std::string diff = batch.Verify(); !diff.empty()) {
            errors[t] = diff;
          }
        }
      });
    }
    for (std::thread& caller : callers) caller.join();
  }
  for (const std::string& error : errors) EXPECT_EQ(error, "");
  // The reader starts no threads; the kernel's io-wq workers (if any were
  // needed) are bounded by max_kernel_workers per ring.
  EXPECT_EQ(WaitForThreadCount(threads_before), threads_before);
  EXPECT_LE(CountIoUringWorkers(), 2 * options.rings);
}

INSTANTIATE_TEST_SUITE_P(Modes, UringRowReaderTest,
                         ::testing::Values(OpenMode::kBuffered,
                                           OpenMode::kDirect, OpenMode::kNfs),
                         [](const ::testing::TestParamInfo<OpenMode>& info) {
                           return std::string(OpenModeName(info.param));
                         });

TEST(UringRowReaderOptionsTest, InvalidOptionsNameTheField) {
  struct Case {
    std::string field;
    UringRowReaderOptions options;
  };
  std::vector<Case> cases(6);
  cases[0] = {"rings", {}};
  cases[0].options.rings = 0;
  cases[1] = {"queue_depth", {}};
  cases[1].options.queue_depth = 0;
  cases[2] = {"queue_depth", {}};
  cases[2].options.queue_depth = 5000;
  cases[3] = {"max_kernel_workers", {}};
  cases[3].options.max_kernel_workers = -1;
  cases[4] = {"buffer_bytes", {}};
  cases[4].options.buffer_bytes = 4096;
  cases[5] = {"coalesce.max_gap_bytes", {}};
  cases[5].options.coalesce.max_gap_bytes = 1 << 30;
  for (const Case& c : cases) {
    absl::StatusOr<std::unique_ptr<UringRowReader>> reader =
        UringRowReader::Create(c.options);
    EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(reader.status().message()),
                HasSubstr("UringRowReaderOptions." + c.field));
  }
}

TEST(UringRowReaderOptionsTest, DefaultsCreateOrReportUnavailable) {
  absl::StatusOr<std::unique_ptr<UringRowReader>> reader =
      UringRowReader::Create({});
  if (!reader.ok()) {
    EXPECT_EQ(reader.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(std::string(reader.status().message()),
                HasSubstr("io_uring_queue_init"));
    GTEST_SKIP() << reader.status();
  }
}

}  // namespace
}  // namespace mneme::engram
