// PreadPoolReader specifics, with faults injected under the pool through its
// pread hook: EIO and other errnos, short reads, stalls past the deadline
// (the pool keeps serving, no thread is added, late reads never reach the
// caller), a full queue, option validation and the inline path.

#include "engram_store/io/pread_pool_reader.h"

#include <cerrno>
#include <memory>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engram_store/io/row_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engram_store/io/fault_injecting_pread.h"
#include "tests/engram_store/io/io_test_util.h"

namespace mneme::engram {
namespace {

using ::mneme::engram::testing::FaultInjectingPread;
using ::mneme::engram::testing::SpanBatch;
using ::mneme::engram::testing::TempPath;
using ::mneme::engram::testing::WaitForThreadCount;
using ::mneme::engram::testing::WriteRandomFile;
using ::testing::HasSubstr;

constexpr uint64_t kFileSize = 2 * 1024 * 1024 + 77;

class PreadPoolReaderTest : public ::testing::TestWithParam<OpenMode> {
 protected:
  void SetUp() override {
    path_ = TempPath(absl::StrCat("pool_", OpenModeName(GetParam()), ".bin"));
    ASSERT_TRUE(WriteRandomFile(path_, kFileSize, 5).ok());
    file_ = *RowFile::Open(path_, GetParam());
  }

  std::unique_ptr<PreadPoolReader> MakeReader(int threads = 2,
                                              int queue_capacity = 64) {
    PreadPoolReaderOptions options;
    options.threads = threads;
    options.queue_capacity = queue_capacity;
    options.reads_per_task = 4;
    options.inline_max_spans = 0;
    options.pread = faults_.AsFunction();
    return *PreadPoolReader::Create(options);
  }

  SpanBatch RandomRows(int n, uint64_t seed, uint64_t begin = 0,
                       uint64_t end = kFileSize) {
    std::mt19937_64 rng(seed);
    SpanBatch batch;
    for (int i = 0; i < n; ++i) {
      batch.Add(file_.get(), begin + rng() % (end - begin - 264), 264);
    }
    batch.Finish();
    return batch;
  }

  std::string path_;
  std::unique_ptr<RowFile> file_;
  FaultInjectingPread faults_;
};

TEST_P(PreadPoolReaderTest, ShortReadsAreResubmitted) {
  // Every pread returns at most this many bytes (the rest of its buffer is
  // garbage). O_DIRECT reads end short only on block boundaries (or at end
  // of file), so there the limit is a page.
  const uint64_t most = GetParam() == OpenMode::kDirect ? 4096 : 100;
  faults_.ShortenReads(most);
  std::unique_ptr<PreadPoolReader> reader = MakeReader();
  std::mt19937_64 rng(1);
  SpanBatch batch;
  for (int i = 0; i < 400; ++i) {
    const uint64_t length = i % 2 == 0 ? 264 : 10000;
    batch.Add(file_.get(), rng() % (kFileSize - length), length);
  }
  batch.Finish();
  ASSERT_TRUE(reader->Read(batch.spans(), absl::InfiniteFuture()).ok());
  EXPECT_EQ(batch.Verify(), "");
  // Every read came back short and its remainder was asked for again.
  const RowReaderStats stats = reader->GetStats();
  EXPECT_GE(stats.reads * most, stats.bytes_read);
  EXPECT_GT(stats.reads, 400u);
}

TEST_P(PreadPoolReaderTest, EioIsDataLossNamingFileAndOffset) {
  faults_.FailRange(1000000, 1000001, EIO, /*times=*/1);
  std::unique_ptr<PreadPoolReader> reader = MakeReader();
  SpanBatch batch;
  batch.Add(file_.get(), 10, 264);
  batch.Add(file_.get(), 999900, 264);
  batch.Finish();
  const absl::Status status =
      reader->Read(batch.spans(), absl::InfiniteFuture());
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(path_));
  EXPECT_THAT(std::string(status.message()), HasSubstr("Input/output error"));
  // The fault was one-off: the same read now succeeds.
  batch.Reset();
  ASSERT_TRUE(reader->Read(batch.spans(), absl::InfiniteFuture()).ok());
  EXPECT_EQ(batch.Verify(), "");
  EXPECT_EQ(reader->GetStats().failed_requests, 1u);
}

TEST_P(PreadPoolReaderTest, OtherErrnosKeepTheirMeaning) {
  faults_.FailRange(0, kFileSize, ENOMEM, /*times=*/1);
  std::unique_ptr<PreadPoolReader> reader = MakeReader();
  SpanBatch batch = RandomRows(10, 3);
  EXPECT_EQ(reader->Read(batch.spans(), absl::InfiniteFuture()).code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_P(PreadPoolReaderTest, StallReturnsDeadlineExceededAndPoolKeepsServing) {
  // The test's main thread and the pool's, nothing more, all along.
  ASSERT_EQ(WaitForThreadCount(1), 1);
  std::unique_ptr<PreadPoolReader> reader = MakeReader(/*threads=*/2);
  const int threads_before = 1 + 2;

  faults_.StallRange(0, 4096);
  SpanBatch stalled;
  stalled.Add(file_.get(), 100, 264);
  stalled.Finish();
  const absl::Status status =
      reader->Read(stalled.spans(), absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  faults_.WaitForStalled(1);  // Still stuck in the kernel, so to speak.

  // The other worker still serves reads elsewhere in the file.
  SpanBatch other = RandomRows(300, 4, /*begin=*/8192);
  ASSERT_TRUE(reader->Read(other.spans(), absl::InfiniteFuture()).ok());
  EXPECT_EQ(other.Verify(), "");
  EXPECT_EQ(WaitForThreadCount(threads_before), threads_before);

  // The stalled pread finally returns; its bytes must not reach the caller's
  // buffer, which it has long since given up on.
  stalled.Reset();
  faults_.Release();
  faults_.WaitUntilNoneStalled();
  SpanBatch after = RandomRows(300, 5);
  ASSERT_TRUE(reader->Read(after.spans(), absl::InfiniteFuture()).ok());
  EXPECT_EQ(after.Verify(), "");
  EXPECT_EQ(WaitForThreadCount(threads_before), threads_before);
  EXPECT_EQ(reader->GetStats().deadline_exceeded, 1u);
  reader.reset();  // Joins the workers: every late completion is done.
  EXPECT_TRUE(stalled.Untouched());
}

TEST_P(PreadPoolReaderTest, FullQueueIsDeadlineExceededNotUnboundedGrowth) {
  ASSERT_EQ(WaitForThreadCount(1), 1);
  std::unique_ptr<PreadPoolReader> reader =
      MakeReader(/*threads=*/1, /*queue_capacity=*/1);
  const int threads_before = 1 + 1;
  faults_.StallRange(0, 4096);
  SpanBatch stalled;
  stalled.Add(file_.get(), 0, 8);
  stalled.Finish();
  EXPECT_EQ(reader->Read(stalled.spans(), absl::Now() + absl::Milliseconds(20))
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  faults_.WaitForStalled(1);
  // The only worker is stuck: this one's work waits in the queue...
  SpanBatch queued = RandomRows(10, 6, /*begin=*/8192);
  EXPECT_EQ(
      reader->Read(queued.spans(), absl::Now() + absl::Milliseconds(20)).code(),
      absl::StatusCode::kDeadlineExceeded);
  // ...and this one finds the queue full.
  SpanBatch refused = RandomRows(10, 7, /*begin=*/8192);
  const absl::Status status =
      reader->Read(refused.spans(), absl::Now() + absl::Milliseconds(20));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(status.message()), HasSubstr("queue"));
  EXPECT_EQ(WaitForThreadCount(threads_before), threads_before);

  faults_.Release();
  SpanBatch later = RandomRows(50, 8);
  ASSERT_TRUE(reader->Read(later.spans(), absl::InfiniteFuture()).ok());
  EXPECT_EQ(later.Verify(), "");
  reader.reset();
  EXPECT_TRUE(stalled.Untouched());
  EXPECT_TRUE(queued.Untouched());
  EXPECT_TRUE(refused.Untouched());
}

TEST_P(PreadPoolReaderTest, ThreadCountDoesNotGrowWithCalls) {
  ASSERT_EQ(WaitForThreadCount(1), 1);
  std::unique_ptr<PreadPoolReader> reader = MakeReader(/*threads=*/3);
  const int threads_before = 1 + 3;
  for (int i = 0; i < 50; ++i) {
    SpanBatch batch = RandomRows(100, 100 + i);
    ASSERT_TRUE(reader->Read(batch.spans(), absl::InfiniteFuture()).ok());
  }
  EXPECT_EQ(WaitForThreadCount(threads_before), threads_before);
  reader.reset();
  EXPECT_EQ(WaitForThreadCount(1), 1);
}

INSTANTIATE_TEST_SUITE_P(Modes, PreadPoolReaderTest,
                         ::testing::Values(OpenMode::kBuffered,
                                           OpenMode::kDirect, OpenMode::kNfs),
                         [](const ::testing::TestParamInfo<OpenMode>& info) {
                           return std::string(OpenModeName(info.param));
                         });

TEST(PreadPoolReaderOptionsTest, InvalidOptionsNameTheField) {
  struct Case {
    std::string field;
    PreadPoolReaderOptions options;
  };
  std::vector<Case> cases(5);
  cases[0] = {"threads", {}};
  cases[0].options.threads = 0;
  cases[1] = {"queue_capacity", {}};
  cases[1].options.queue_capacity = 0;
  cases[2] = {"reads_per_task", {}};
  cases[2].options.reads_per_task = 0;
  cases[3] = {"inline_max_spans", {}};
  cases[3].options.inline_max_spans = -1;
  cases[4] = {"coalesce.max_read_bytes", {}};
  cases[4].options.coalesce.max_read_bytes = 1000;
  for (const Case& c : cases) {
    absl::StatusOr<std::unique_ptr<PreadPoolReader>> reader =
        PreadPoolReader::Create(c.options);
    EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(reader.status().message()),
                HasSubstr("PreadPoolReaderOptions." + c.field));
  }
  EXPECT_TRUE(PreadPoolReader::Create({}).ok());
}

TEST(PreadPoolReaderInlineTest, OnlySmallBufferedBatchesRunInline) {
  const std::string path = TempPath("pool_inline.bin");
  ASSERT_TRUE(WriteRandomFile(path, 100000, 9).ok());
  std::unique_ptr<RowFile> buffered = *RowFile::Open(path, OpenMode::kBuffered);
  std::unique_ptr<RowFile> direct = *RowFile::Open(path, OpenMode::kDirect);
  std::unique_ptr<RowFile> nfs = *RowFile::Open(path, OpenMode::kNfs);
  PreadPoolReaderOptions options;
  options.threads = 2;
  options.inline_max_spans = 32;
  std::unique_ptr<PreadPoolReader> reader = *PreadPoolReader::Create(options);

  auto read = [&](const RowFile* file, int spans) {
    SpanBatch batch;
    for (int i = 0; i < spans; ++i) batch.Add(file, uint64_t{1000} * i, 264);
    batch.Finish();
    EXPECT_TRUE(reader->Read(batch.spans(), absl::InfiniteFuture()).ok());
    EXPECT_EQ(batch.Verify(), "");
    return reader->GetStats().inline_requests;
  };
  EXPECT_EQ(read(buffered.get(), 31), 1u);
  EXPECT_EQ(read(buffered.get(), 32), 1u);  // Not fewer than 32.
  EXPECT_EQ(read(direct.get(), 1), 1u);
  EXPECT_EQ(read(nfs.get(), 1), 1u);
  EXPECT_EQ(reader->GetStats().requests, 4u);
}

}  // namespace
}  // namespace mneme::engram
