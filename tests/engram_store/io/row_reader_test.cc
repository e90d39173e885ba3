// Every RowReader implementation x open mode against real files: the bytes of
// random, duplicate, page-sharing, boundary and Engram-row spans match a plain
// pread; invalid spans, truncated files and deadlines give their codes.

#include "engram_store/io/row_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engram_store/io/row_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engram_store/io/io_test_util.h"
#include "tests/engram_store/io/reader_factory.h"

namespace mneme::engram {
namespace {

using ::mneme::engram::testing::MakeReader;
using ::mneme::engram::testing::ReaderKind;
using ::mneme::engram::testing::ReaderKindName;
using ::mneme::engram::testing::SpanBatch;
using ::mneme::engram::testing::TempPath;
using ::mneme::engram::testing::WriteRandomFile;
using ::testing::HasSubstr;

constexpr uint64_t kPage = 4096;
// Not a whole number of pages, so the last O_DIRECT page is short.
constexpr uint64_t kFileSize = 3 * 1024 * 1024 + 1234;

using Param = std::tuple<ReaderKind, OpenMode>;

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  std::string mode(OpenModeName(std::get<1>(info.param)));
  mode[0] = static_cast<char>(std::toupper(mode[0]));
  return ReaderKindName(std::get<0>(info.param)) + mode;
}

class RowReaderTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<RowReader>> reader = MakeReader(kind());
    if (absl::IsUnavailable(reader.status())) {
      GTEST_SKIP() << "io_uring unavailable here: " << reader.status();
    }
    ASSERT_TRUE(reader.ok()) << reader.status();
    reader_ = *std::move(reader);
    path_ = TempPath(absl::StrCat("rows_", ParamName({GetParam(), 0}), ".bin"));
    ASSERT_TRUE(WriteRandomFile(path_, kFileSize, /*seed=*/42).ok());
    file_ = Open(path_);
  }

  ReaderKind kind() const { return std::get<0>(GetParam()); }
  OpenMode mode() const { return std::get<1>(GetParam()); }

  std::unique_ptr<RowFile> Open(const std::string& path) {
    absl::StatusOr<std::unique_ptr<RowFile>> file = RowFile::Open(path, mode());
    EXPECT_TRUE(file.ok()) << file.status();
    return file.ok() ? *std::move(file) : nullptr;
  }

  absl::Status Read(const SpanBatch& batch,
                    absl::Time deadline = absl::InfiniteFuture()) {
    return reader_->Read(batch.spans(), deadline);
  }

  std::unique_ptr<RowReader> reader_;
  std::string path_;
  std::unique_ptr<RowFile> file_;
};

TEST_P(RowReaderTest, RandomSpansMatchPread) {
  std::mt19937_64 rng(7);
  const uint64_t lengths[] = {264, 144, 8, 16, 1, 256, 128, 4095, 4096, 4097};
  SpanBatch batch;
  std::vector<std::pair<uint64_t, uint64_t>> added;
  auto add = [&](uint64_t offset, uint64_t length) {
    batch.Add(file_.get(), offset, length);
    added.emplace_back(offset, length);
  };
  for (int i = 0; i < 1500; ++i) {
    const uint64_t length =
        (i % 5 == 4) ? 1 + rng() % 20000 : lengths[rng() % std::size(lengths)];
    add(rng() % (kFileSize - length + 1), length);
  }
  // First and last bytes of the file.
  add(0, 1);
  add(0, 264);
  add(kFileSize - 1, 1);
  add(kFileSize - 8, 8);
  add(kFileSize - 264, 264);
  add(kFileSize - 144, 144);
  // Crossing page boundaries.
  for (uint64_t page = 1; page < 20; ++page) {
    add(page * kPage - 100, 264);
    add(page * kPage - 4, 8);
    add(page * kPage - 1, 16);
  }
  // Rows sharing pages: 40 neighbouring 264-byte rows.
  for (uint64_t row = 0; row < 40; ++row) add(1000000 + row * 264, 264);
  // Duplicates, into separate destinations.
  const size_t unique = added.size();
  for (int i = 0; i < 300; ++i) {
    const auto [offset, length] = added[rng() % unique];
    add(offset, length);
  }
  batch.Finish();
  ASSERT_TRUE(Read(batch).ok());
  EXPECT_EQ(batch.Verify(), "");

  // A second read into the same buffers returns the same bytes.
  batch.Reset();
  ASSERT_TRUE(Read(batch).ok());
  EXPECT_EQ(batch.Verify(), "");

  const RowReaderStats stats = reader_->GetStats();
  EXPECT_EQ(stats.requests, 2u);
  EXPECT_EQ(stats.spans, 2 * batch.size());
  EXPECT_LT(stats.unique_spans, stats.spans);
  EXPECT_GT(stats.bytes_delivered, 0u);
}

// Engram rows as a table stores them: weight bytes in one tensor, scale bytes
// in another, packed by the caller as weight || scale.
TEST_P(RowReaderTest, EngramRowsPackedWeightThenScale) {
  struct Layout {
    uint64_t weight_bytes;
    uint64_t scale_bytes;
  };
  for (const Layout layout : {Layout{256, 8}, Layout{128, 16}}) {
    SCOPED_TRACE(layout.weight_bytes);
    const uint64_t row_bytes = layout.weight_bytes + layout.scale_bytes;
    const uint64_t header = 4000;  // Like a safetensors header: unaligned.
    const uint64_t rows = (kFileSize - header) / row_bytes;
    const uint64_t weight_base = header;
    const uint64_t scale_base = header + rows * layout.weight_bytes;
    std::mt19937_64 rng(layout.weight_bytes);
    std::vector<uint64_t> ids;
    ids.reserve(440);
    for (int i = 0; i < 400; ++i) ids.push_back(rng() % rows);
    for (uint64_t r = 100; r < 140; ++r) ids.push_back(r);  // Neighbours.
    ids.push_back(0);
    ids.push_back(rows - 1);
    for (int i = 0; i < 50; ++i) ids.push_back(ids[rng() % ids.size()]);

    SpanBatch batch;
    for (size_t i = 0; i < ids.size(); ++i) {
      const uint64_t dest = i * (row_bytes + SpanBatch::kGuardBytes);
      batch.AddWithDest(file_.get(), weight_base + ids[i] * layout.weight_bytes,
                        layout.weight_bytes, dest);
      batch.AddWithDest(file_.get(), scale_base + ids[i] * layout.scale_bytes,
                        layout.scale_bytes, dest + layout.weight_bytes);
    }
    batch.Finish();
    ASSERT_TRUE(Read(batch).ok());
    EXPECT_EQ(batch.Verify(), "");
  }
}

TEST_P(RowReaderTest, LargeBatchMatchesPread) {
  std::mt19937_64 rng(11);
  SpanBatch batch;
  for (int i = 0; i < 20000; ++i) {
    batch.Add(file_.get(), rng() % (kFileSize - 264), 264);
  }
  batch.Finish();
  ASSERT_TRUE(Read(batch).ok());
  EXPECT_EQ(batch.Verify(), "");
}

TEST_P(RowReaderTest, SpansOfSeveralFilesInOneBatch) {
  const std::string other_path =
      TempPath(absl::StrCat("other_", ParamName({GetParam(), 0}), ".bin"));
  ASSERT_TRUE(WriteRandomFile(other_path, 100 * 1000 + 7, /*seed=*/9).ok());
  std::unique_ptr<RowFile> other = Open(other_path);
  ASSERT_NE(other, nullptr);
  std::mt19937_64 rng(5);
  SpanBatch batch;
  for (int i = 0; i < 500; ++i) {
    if (i % 2 == 0) {
      batch.Add(file_.get(), rng() % (kFileSize - 264), 264);
    } else {
      batch.Add(other.get(), rng() % (other->size() - 144), 144);
    }
  }
  // Same offsets in both files must not be confused.
  batch.Add(file_.get(), 4096, 264);
  batch.Add(other.get(), 4096, 264);
  batch.Finish();
  ASSERT_TRUE(Read(batch).ok());
  EXPECT_EQ(batch.Verify(), "");
}

TEST_P(RowReaderTest, ConcurrentCallers) {
  std::vector<std::thread> threads;
  threads.reserve(4);
  std::vector<std::string> results(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(100 + t);
      for (int round = 0; round < 20; ++round) {
        SpanBatch batch;
        const int n = 1 + static_cast<int>(rng() % 200);
        for (int i = 0; i < n; ++i) {
          batch.Add(file_.get(), rng() % (kFileSize - 264), 264);
        }
        batch.Finish();
        const absl::Status status =
            reader_->Read(batch.spans(), absl::InfiniteFuture());
        if (!status.ok()) {
          results[t] = status.ToString();
          return;
        }
        if (std::string diff = batch.Verify(); !diff.empty()) {
          results[t] = diff;
          return;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::string& result : results) EXPECT_EQ(result, "");
}

TEST_P(RowReaderTest, EmptyBatchAndEmptySpans) {
  EXPECT_TRUE(reader_->Read({}, absl::InfiniteFuture()).ok());
  const ReadSpan empty[] = {{nullptr, 0, 0, nullptr},
                            {file_.get(), 5, 0, nullptr}};
  EXPECT_TRUE(reader_->Read(empty, absl::InfiniteFuture()).ok());
}

TEST_P(RowReaderTest, InvalidSpans) {
  uint8_t buffer[300];
  const ReadSpan no_file[] = {{nullptr, 0, 8, buffer}};
  EXPECT_EQ(reader_->Read(no_file, absl::InfiniteFuture()).code(),
            absl::StatusCode::kInvalidArgument);
  const ReadSpan no_dest[] = {{file_.get(), 0, 8, nullptr}};
  EXPECT_EQ(reader_->Read(no_dest, absl::InfiniteFuture()).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> big(1 << 20);
  const ReadSpan too_long[] = {{file_.get(), 0, big.size(), big.data()}};
  EXPECT_EQ(reader_->Read(too_long, absl::InfiniteFuture()).code(),
            absl::StatusCode::kInvalidArgument);

  const ReadSpan past_end[] = {{file_.get(), kFileSize - 100, 264, buffer}};
  const absl::Status status = reader_->Read(past_end, absl::InfiniteFuture());
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(status.message()), HasSubstr(path_));
  const ReadSpan wraps[] = {{file_.get(), ~uint64_t{0} - 4, 8, buffer}};
  EXPECT_EQ(reader_->Read(wraps, absl::InfiniteFuture()).code(),
            absl::StatusCode::kOutOfRange);
}

TEST_P(RowReaderTest, TruncatedFileIsDataLossNamingTheFile) {
  const std::string path =
      TempPath(absl::StrCat("truncated_", ParamName({GetParam(), 0}), ".bin"));
  ASSERT_TRUE(WriteRandomFile(path, kFileSize, /*seed=*/3).ok());
  std::unique_ptr<RowFile> file = Open(path);
  ASSERT_NE(file, nullptr);
  // Truncated under the store, after it opened the file.
  const uint64_t new_size = kFileSize / 2 + 100;
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(new_size)), 0);

  for (const uint64_t offset :
       {new_size + 5000, new_size - 100, kFileSize - 264}) {
    SCOPED_TRACE(offset);
    SpanBatch batch;
    batch.Add(file.get(), 1000, 264);  // Still readable.
    batch.Add(file.get(), offset, 264);
    batch.Finish();
    const absl::Status status = Read(batch);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(path));
  }
  // Spans inside the new size still read fine.
  SpanBatch batch;
  batch.Add(file.get(), 0, 264);
  batch.Add(file.get(), new_size - 264, 264);
  batch.Finish();
  ASSERT_TRUE(Read(batch).ok());
  EXPECT_EQ(batch.Verify(), "");
}

TEST_P(RowReaderTest, DeadlinePassedBeforeStart) {
  SpanBatch batch;
  batch.Add(file_.get(), 0, 264);
  batch.Finish();
  EXPECT_EQ(Read(batch, absl::InfinitePast()).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(batch.Untouched());
  EXPECT_EQ(reader_->GetStats().deadline_exceeded, 1u);
}

// Deadlines that land while reads are in flight: each Read() either succeeds
// with exact bytes or returns DeadlineExceeded; in the latter case nothing may
// write into its buffers afterwards, which is checked once the reader is gone
// (destroying it waits for every abandoned read).
TEST_P(RowReaderTest, DeadlineMidReadNeverWritesAfterReturn) {
  std::mt19937_64 rng(13);
  auto make_batch = [&] {
    auto batch = std::make_unique<SpanBatch>();
    for (int i = 0; i < 3000; ++i) {
      batch->Add(file_.get(), rng() % (kFileSize - 264), 264);
    }
    batch->Finish();
    return batch;
  };
  // Deadlines spread over [0, 2x) the time of one whole read, so that some
  // land before the start, some mid-read and some after the end.
  absl::Time start = absl::Now();
  ASSERT_TRUE(Read(*make_batch()).ok());
  const int64_t whole_us = absl::ToInt64Microseconds(absl::Now() - start) + 1;
  std::vector<std::unique_ptr<SpanBatch>> abandoned;
  int ok = 0;
  for (int round = 0; round < 16; ++round) {
    std::unique_ptr<SpanBatch> batch = make_batch();
    const absl::Duration budget =
        absl::Microseconds(static_cast<int64_t>(rng() % (2 * whole_us)));
    const absl::Status status = Read(*batch, absl::Now() + budget);
    if (status.ok()) {
      ++ok;
      EXPECT_EQ(batch->Verify(), "");
      continue;
    }
    ASSERT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    batch->Reset();
    abandoned.push_back(std::move(batch));
  }
  // The reader still serves.
  SpanBatch batch;
  for (int i = 0; i < 100; ++i) {
    batch.Add(file_.get(), rng() % (kFileSize - 264), 264);
  }
  batch.Finish();
  ASSERT_TRUE(Read(batch).ok());
  EXPECT_EQ(batch.Verify(), "");

  reader_.reset();
  for (const auto& b : abandoned) EXPECT_TRUE(b->Untouched());
  ::testing::Test::RecordProperty("ok_rounds", ok);
}

INSTANTIATE_TEST_SUITE_P(
    AllReadersAndModes, RowReaderTest,
    ::testing::Combine(::testing::Values(ReaderKind::kPoolInline,
                                         ReaderKind::kPool, ReaderKind::kUring),
                       ::testing::Values(OpenMode::kBuffered, OpenMode::kDirect,
                                         OpenMode::kNfs)),
    ParamName);

}  // namespace
}  // namespace mneme::engram
