// Localize(): resuming, verification, repair and the refusals that keep a
// wrong copy from being made or served.
#include "engram_store/local_copy/local_copy_writer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engram_store/local_copy/local_copy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engram_store/local_copy/local_copy_test_util.h"
#include "tests/testing/subprocess.h"

namespace mneme::engram {
namespace {

using ::mneme::engram::testing::FlipByte;
using ::mneme::engram::testing::MakeCheckpoint;
using ::mneme::engram::testing::OneRank;
using ::mneme::engram::testing::OpenCheckpoint;
using ::mneme::engram::testing::ReadFileOrEmpty;
using ::mneme::engram::testing::SharedCheckpointDir;
using ::testing::HasSubstr;

std::string NewOutDir() {
  return ::mneme::testing::MakeTempDir("copy") + "/local";
}

LocalizeOptions Options(const std::string& out, const LocalCopyTarget& target) {
  LocalizeOptions options;
  options.out_dir = out;
  options.target = target;
  // ~30 entries per layer at TP2.
  options.max_range_bytes = 32 << 10;
  options.chunk_bytes = 7000;
  options.threads = 1;
  return options;
}

const LocalCopyTarget kTp2Rank1 = OneRank(2, 1, ColumnSplit::kStrided);

// Every file of a copy directory (manifest and data files), by name.
std::map<std::string, std::string> CopyFiles(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    files[entry.path().filename().string()] =
        ReadFileOrEmpty(entry.path().string());
  }
  return files;
}

bool Exists(const std::string& path) { return std::filesystem::exists(path); }

// Sets a file's mtime to `seconds` since the epoch.
void SetMtime(const std::string& path, int64_t seconds) {
  struct timespec times[2];
  times[0].tv_sec = seconds;
  times[0].tv_nsec = 0;
  times[1] = times[0];
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}

std::string FirstShard(const EngramCheckpoint& checkpoint) {
  return checkpoint.tables()[0].shard_path;
}

// An on_range_done that stops the copy once `n` ranges are done.
std::function<absl::Status(const LocalizeProgress&)> StopAfter(int64_t n) {
  return [n](const LocalizeProgress& p) {
    return p.ranges_done >= n ? absl::CancelledError("stopped by the test")
                              : absl::OkStatus();
  };
}

class LocalizeResumeTest
    : public ::testing::TestWithParam<std::tuple<formats::RowFormat, int>> {};

TEST_P(LocalizeResumeTest, AnInterruptedCopyResumesToIdenticalFiles) {
  const auto [format, threads] = GetParam();
  auto checkpoint = OpenCheckpoint(SharedCheckpointDir(format));
  ASSERT_NE(checkpoint, nullptr);

  const std::string reference = NewOutDir();
  LocalizeOptions options = Options(reference, kTp2Rank1);
  options.threads = threads;
  absl::StatusOr<LocalizeSummary> full = Localize(*checkpoint, options);
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_GT(full->ranges, 20);

  // Stop twice, then finish.
  const std::string out = NewOutDir();
  options.out_dir = out;
  options.on_range_done = StopAfter(5);
  EXPECT_EQ(Localize(*checkpoint, options).status().code(),
            absl::StatusCode::kCancelled);
  EXPECT_FALSE(Exists(out + "/" + kLocalCopyManifestFileName));
  EXPECT_TRUE(Exists(out + "/" + kLocalCopyJournalFileName));
  // An unfinished copy is never served.
  EXPECT_EQ(LocalCopy::Open(out, *checkpoint, kTp2Rank1).status().code(),
            absl::StatusCode::kNotFound);

  options.on_range_done = StopAfter(12);
  absl::StatusOr<LocalizeSummary> second = Localize(*checkpoint, options);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kCancelled);

  options.on_range_done = nullptr;
  absl::StatusOr<LocalizeSummary> last = Localize(*checkpoint, options);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->ranges, full->ranges);
  EXPECT_EQ(last->ranges_copied + last->ranges_reused, last->ranges);
  if (threads == 1) {
    EXPECT_EQ(last->ranges_reused, 12);
  } else {
    EXPECT_GE(last->ranges_reused, 12);
  }
  EXPECT_FALSE(Exists(out + "/" + kLocalCopyJournalFileName));
  EXPECT_TRUE(CopyFiles(out) == CopyFiles(reference));
  EXPECT_TRUE(
      LocalCopy::Open(out, *checkpoint, kTp2Rank1, {.verify_checksums = true})
          .ok());
}

INSTANTIATE_TEST_SUITE_P(
    FormatsAndThreads, LocalizeResumeTest,
    ::testing::Combine(::testing::Values(formats::RowFormat::kFp8,
                                         formats::RowFormat::kNvfp4),
                       ::testing::Values(1, 4)),
    [](const auto& info) {
      return absl::StrCat(formats::RowFormatName(std::get<0>(info.param)),
                          "_threads", std::get<1>(info.param));
    });

TEST(LocalizeTest, ResumeReverifiesAndRecopiesADamagedRange) {
  auto checkpoint =
      OpenCheckpoint(SharedCheckpointDir(formats::RowFormat::kFp8));
  ASSERT_NE(checkpoint, nullptr);
  const std::string reference = NewOutDir();
  ASSERT_TRUE(Localize(*checkpoint, Options(reference, kTp2Rank1)).ok());

  const std::string out = NewOutDir();
  LocalizeOptions options = Options(out, kTp2Rank1);
  options.on_range_done = StopAfter(6);
  ASSERT_EQ(Localize(*checkpoint, options).status().code(),
            absl::StatusCode::kCancelled);
  // Damage the first (journaled) range, and tear the journal's last line.
  FlipByte(out + "/" + LocalCopyDataFileName(checkpoint->tables()[0].layer),
           100);
  {
    std::ofstream journal(out + "/" + kLocalCopyJournalFileName, std::ios::app);
    journal << "range 1 0 5";
  }
  options.on_range_done = nullptr;
  absl::StatusOr<LocalizeSummary> summary = Localize(*checkpoint, options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->ranges_reused, 5);
  EXPECT_EQ(summary->ranges_copied, summary->ranges - 5);
  EXPECT_TRUE(CopyFiles(out) == CopyFiles(reference));
}

TEST(LocalizeTest, VerificationCatchesAFlippedByteAndARerunRepairsIt) {
  for (formats::RowFormat format :
       {formats::RowFormat::kFp8, formats::RowFormat::kNvfp4}) {
    SCOPED_TRACE(formats::RowFormatName(format));
    auto checkpoint = OpenCheckpoint(SharedCheckpointDir(format));
    ASSERT_NE(checkpoint, nullptr);
    const std::string out = NewOutDir();
    ASSERT_TRUE(Localize(*checkpoint, Options(out, kTp2Rank1)).ok());
    const auto intact = CopyFiles(out);
    const int layer = checkpoint->tables()[1].layer;
    const std::string data = out + "/" + LocalCopyDataFileName(layer);
    FlipByte(data, std::filesystem::file_size(data) / 2);

    absl::StatusOr<std::unique_ptr<LocalCopy>> verified = LocalCopy::Open(
        out, *checkpoint, kTp2Rank1, {.verify_checksums = true});
    EXPECT_EQ(verified.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(verified.status().message(),
                HasSubstr(absl::StrCat("layer ", layer)));
    // Without verification the copy opens (checking ~47 GB at every start
    // is too slow); an explicit check finds the damage.
    absl::StatusOr<std::unique_ptr<LocalCopy>> unverified =
        LocalCopy::Open(out, *checkpoint, kTp2Rank1);
    ASSERT_TRUE(unverified.ok()) << unverified.status();
    EXPECT_EQ((*unverified)->VerifyChecksums(PageCachePolicy::kKeep).code(),
              absl::StatusCode::kDataLoss);

    absl::StatusOr<LocalizeSummary> repair =
        Localize(*checkpoint, Options(out, kTp2Rank1));
    ASSERT_TRUE(repair.ok()) << repair.status();
    EXPECT_EQ(repair->ranges_copied, 1);
    EXPECT_EQ(repair->ranges_reused, repair->ranges - 1);
    EXPECT_TRUE(CopyFiles(out) == intact);
    EXPECT_TRUE(
        LocalCopy::Open(out, *checkpoint, kTp2Rank1, {.verify_checksums = true})
            .ok());
  }
}

TEST(LocalizeTest, RerunningOnACompleteCopyChangesNothing) {
  auto checkpoint =
      OpenCheckpoint(SharedCheckpointDir(formats::RowFormat::kFp8));
  ASSERT_NE(checkpoint, nullptr);
  const std::string out = NewOutDir();
  ASSERT_TRUE(Localize(*checkpoint, Options(out, kTp2Rank1)).ok());
  const auto before = CopyFiles(out);
  const auto manifest_time =
      std::filesystem::last_write_time(out + "/" + kLocalCopyManifestFileName);
  absl::StatusOr<LocalizeSummary> again =
      Localize(*checkpoint, Options(out, kTp2Rank1));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->ranges_copied, 0);
  EXPECT_EQ(again->ranges_reused, again->ranges);
  EXPECT_EQ(again->bytes_copied, 0u);
  EXPECT_TRUE(CopyFiles(out) == before);
  EXPECT_EQ(
      std::filesystem::last_write_time(out + "/" + kLocalCopyManifestFileName),
      manifest_time);
}

TEST(LocalizeTest, RefusesACopyOfAnotherTargetUnlessForced) {
  auto checkpoint =
      OpenCheckpoint(SharedCheckpointDir(formats::RowFormat::kFp8));
  ASSERT_NE(checkpoint, nullptr);
  const std::string out = NewOutDir();
  const LocalCopyTarget rank0 = OneRank(2, 0, ColumnSplit::kStrided);
  ASSERT_TRUE(Localize(*checkpoint, Options(out, rank0)).ok());
  const auto rank0_files = CopyFiles(out);

  for (const LocalCopyTarget& other :
       {kTp2Rank1, OneRank(4, 0, ColumnSplit::kStrided),
        OneRank(2, 0, ColumnSplit::kContiguous)}) {
    SCOPED_TRACE(DescribeTarget(other));
    absl::StatusOr<LocalizeSummary> refused =
        Localize(*checkpoint, Options(out, other));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(refused.status().message(), HasSubstr(DescribeTarget(rank0)));
    EXPECT_THAT(refused.status().message(), HasSubstr("--force"));
    EXPECT_TRUE(CopyFiles(out) == rank0_files);
    // And a store of that target does not take it.
    absl::StatusOr<std::unique_ptr<LocalCopy>> open =
        LocalCopy::Open(out, *checkpoint, other);
    EXPECT_EQ(open.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(open.status().message(), HasSubstr(DescribeTarget(rank0)));
  }

  LocalizeOptions forced = Options(out, kTp2Rank1);
  forced.force = true;
  absl::StatusOr<LocalizeSummary> replaced = Localize(*checkpoint, forced);
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_EQ(replaced->ranges_reused, 0);
  EXPECT_TRUE(
      LocalCopy::Open(out, *checkpoint, kTp2Rank1, {.verify_checksums = true})
          .ok());
  EXPECT_EQ(LocalCopy::Open(out, *checkpoint, rank0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(LocalizeTest, RefusesAnUnfinishedCopyOfAnotherTargetUnlessForced) {
  auto checkpoint =
      OpenCheckpoint(SharedCheckpointDir(formats::RowFormat::kFp8));
  ASSERT_NE(checkpoint, nullptr);
  const std::string out = NewOutDir();
  LocalizeOptions options = Options(out, OneRank(2, 0, ColumnSplit::kStrided));
  options.on_range_done = StopAfter(3);
  ASSERT_EQ(Localize(*checkpoint, options).status().code(),
            absl::StatusCode::kCancelled);
  absl::StatusOr<LocalizeSummary> refused =
      Localize(*checkpoint, Options(out, kTp2Rank1));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("unfinished"));
  LocalizeOptions forced = Options(out, kTp2Rank1);
  forced.force = true;
  absl::StatusOr<LocalizeSummary> done = Localize(*checkpoint, forced);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->ranges_reused, 0);
  EXPECT_TRUE(
      LocalCopy::Open(out, *checkpoint, kTp2Rank1, {.verify_checksums = true})
          .ok());
}

TEST(LocalizeTest, RefusesACopyOfAnotherSourceUnlessForced) {
  const std::string dir = MakeCheckpoint(formats::RowFormat::kFp8, 9);
  auto checkpoint = OpenCheckpoint(dir);
  ASSERT_NE(checkpoint, nullptr);
  const std::string out = NewOutDir();
  ASSERT_TRUE(Localize(*checkpoint, Options(out, kTp2Rank1)).ok());

  // Another checkpoint of the same shape: same file names and sizes, other
  // rows.
  auto other = OpenCheckpoint(SharedCheckpointDir(formats::RowFormat::kFp8));
  ASSERT_NE(other, nullptr);
  absl::StatusOr<std::unique_ptr<LocalCopy>> open =
      LocalCopy::Open(out, *other, kTp2Rank1);
  EXPECT_EQ(open.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(open.status().message(), HasSubstr("different checkpoint"));

  // The same checkpoint with a shard rewritten since.
  SetMtime(FirstShard(*checkpoint), 1'000'000'000);
  open = LocalCopy::Open(out, *checkpoint, kTp2Rank1);
  EXPECT_EQ(open.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      open.status().message(),
      HasSubstr(
          std::filesystem::path(FirstShard(*checkpoint)).filename().string()));
  absl::StatusOr<LocalizeSummary> refused =
      Localize(*checkpoint, Options(out, kTp2Rank1));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  LocalizeOptions forced = Options(out, kTp2Rank1);
  forced.force = true;
  ASSERT_TRUE(Localize(*checkpoint, forced).ok());
  EXPECT_TRUE(LocalCopy::Open(out, *checkpoint, kTp2Rank1).ok());

  // Another format of the same model.
  auto nvfp4 = OpenCheckpoint(SharedCheckpointDir(formats::RowFormat::kNvfp4));
  ASSERT_NE(nvfp4, nullptr);
  EXPECT_EQ(LocalCopy::Open(out, *nvfp4, kTp2Rank1).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(LocalizeTest, ASourceChangingDuringTheCopyAborts) {
  const std::string dir = MakeCheckpoint(formats::RowFormat::kNvfp4, 4);
  auto checkpoint = OpenCheckpoint(dir);
  ASSERT_NE(checkpoint, nullptr);
  const std::string out = NewOutDir();
  LocalizeOptions options = Options(out, kTp2Rank1);
  const std::string shard = FirstShard(*checkpoint);
  options.on_range_done = [&](const LocalizeProgress& p) {
    if (p.ranges_done == 2) SetMtime(shard, 2'000'000'000);
    return absl::OkStatus();
  };
  absl::StatusOr<LocalizeSummary> summary = Localize(*checkpoint, options);
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(Exists(out + "/" + kLocalCopyManifestFileName));
  // Run again: the journal of the old source is dropped, not trusted.
  options.on_range_done = nullptr;
  absl::StatusOr<LocalizeSummary> again = Localize(*checkpoint, options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->ranges_reused, 0);
  EXPECT_TRUE(
      LocalCopy::Open(out, *checkpoint, kTp2Rank1, {.verify_checksums = true})
          .ok());
}

TEST(LocalizeTest, RefusesTheCheckpointDirectoryAsOutput) {
  const std::string dir = MakeCheckpoint(formats::RowFormat::kFp8, 5);
  auto checkpoint = OpenCheckpoint(dir);
  ASSERT_NE(checkpoint, nullptr);
  const auto before = CopyFiles(dir);
  for (const std::string& out : {dir, dir + "/", dir + "/."}) {
    absl::StatusOr<LocalizeSummary> summary =
        Localize(*checkpoint, Options(out, kTp2Rank1));
    EXPECT_EQ(summary.status().code(), absl::StatusCode::kInvalidArgument)
        << out;
    EXPECT_THAT(summary.status().message(), HasSubstr("checkpoint directory"));
  }
  EXPECT_TRUE(CopyFiles(dir) == before);
}

TEST(LocalizeTest, RefusesAnOutputAnotherRunHolds) {
  auto checkpoint =
      OpenCheckpoint(SharedCheckpointDir(formats::RowFormat::kFp8));
  ASSERT_NE(checkpoint, nullptr);
  const std::string out = NewOutDir();
  ASSERT_EQ(::mkdir(out.c_str(), 0755), 0);
  const int fd = ::open(out.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  EXPECT_EQ(Localize(*checkpoint, Options(out, kTp2Rank1)).status().code(),
            absl::StatusCode::kUnavailable);
  ::close(fd);
  EXPECT_TRUE(Localize(*checkpoint, Options(out, kTp2Rank1)).ok());
}

TEST(LocalizeTest, CreatesMissingParentsAndOpensTheCheckpointItself) {
  LocalizeOptions options = Options(NewOutDir() + "/a/b", kTp2Rank1);
  options.checkpoint_dir = SharedCheckpointDir(formats::RowFormat::kNvfp4);
  absl::StatusOr<LocalizeSummary> summary = Localize(options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->manifest_path,
            options.out_dir + "/" + kLocalCopyManifestFileName);
  auto checkpoint = OpenCheckpoint(options.checkpoint_dir);
  EXPECT_TRUE(LocalCopy::Open(options.out_dir, *checkpoint, kTp2Rank1).ok());

  options.checkpoint_dir = NewOutDir() + "/missing";
  EXPECT_EQ(Localize(options).status().code(), absl::StatusCode::kNotFound);
}

TEST(LocalizeTest, RejectsInvalidOptionsNamingTheField) {
  auto checkpoint =
      OpenCheckpoint(SharedCheckpointDir(formats::RowFormat::kFp8));
  ASSERT_NE(checkpoint, nullptr);
  const std::string out = NewOutDir();
  struct Case {
    std::function<void(LocalizeOptions&)> change;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](LocalizeOptions& o) { o.out_dir.clear(); }, "out_dir"},
      {[](LocalizeOptions& o) { o.threads = 0; }, "threads"},
      {[](LocalizeOptions& o) { o.threads = 65; }, "threads"},
      {[](LocalizeOptions& o) { o.chunk_bytes = 0; }, "chunk_bytes"},
      {[](LocalizeOptions& o) { o.max_range_bytes = 0; }, "max_range_bytes"},
      {[](LocalizeOptions& o) { o.page_cache = PageCachePolicy::kUnspecified; },
       "page_cache"},
      {[](LocalizeOptions& o) { o.target.ranks.clear(); }, "ranks"},
      {[](LocalizeOptions& o) { o.target.ranks = {2}; }, "rank 2"},
      {[](LocalizeOptions& o) {
         o.target.ranks = {1, 0};
       },
       "ascending"},
      {[](LocalizeOptions& o) { o.target.tp_size = 0; }, "tp_size"},
      {[](LocalizeOptions& o) { o.target.split = ColumnSplit::kUnspecified; },
       "split"},
      // 8 heads per order do not split 3 ways.
      {[](LocalizeOptions& o) {
         o.target.tp_size = 3;
         o.target.ranks = {0};
       },
       "does not divide"},
  };
  for (const Case& c : cases) {
    LocalizeOptions options = Options(out, kTp2Rank1);
    c.change(options);
    const absl::Status status = Localize(*checkpoint, options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(status.message(), HasSubstr(c.field));
  }
  LocalizeOptions options = Options(out, kTp2Rank1);
  EXPECT_EQ(Localize(options).status().code(),
            absl::StatusCode::kInvalidArgument);  // no checkpoint_dir
}

TEST(LocalCopyOpenTest, MissingOrDamagedCopiesGiveClearErrors) {
  auto checkpoint =
      OpenCheckpoint(SharedCheckpointDir(formats::RowFormat::kFp8));
  ASSERT_NE(checkpoint, nullptr);
  // No directory, and a directory without a manifest.
  const std::string missing = NewOutDir() + "/nothing";
  absl::StatusOr<std::unique_ptr<LocalCopy>> open =
      LocalCopy::Open(missing, *checkpoint, kTp2Rank1);
  EXPECT_EQ(open.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(open.status().message(), HasSubstr(missing));
  const std::string empty = ::mneme::testing::MakeTempDir("empty");
  open = LocalCopy::Open(empty, *checkpoint, kTp2Rank1);
  EXPECT_EQ(open.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(open.status().message(), HasSubstr(kLocalCopyManifestFileName));

  const std::string out = NewOutDir();
  ASSERT_TRUE(Localize(*checkpoint, Options(out, kTp2Rank1)).ok());
  const std::string manifest = out + "/" + kLocalCopyManifestFileName;
  const std::string text = ReadFileOrEmpty(manifest);
  const std::string data =
      out + "/" + LocalCopyDataFileName(checkpoint->tables()[0].layer);

  // A truncated data file.
  std::filesystem::resize_file(data, std::filesystem::file_size(data) - 1);
  open = LocalCopy::Open(out, *checkpoint, kTp2Rank1);
  EXPECT_EQ(open.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(open.status().message(), HasSubstr(data));
  // A missing data file.
  std::filesystem::remove(data);
  EXPECT_EQ(LocalCopy::Open(out, *checkpoint, kTp2Rank1).status().code(),
            absl::StatusCode::kNotFound);
  // A corrupt manifest: refused by readers, and by Localize() unless forced.
  std::ofstream(manifest, std::ios::trunc) << text.substr(0, text.size() / 2);
  EXPECT_EQ(LocalCopy::Open(out, *checkpoint, kTp2Rank1).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(Localize(*checkpoint, Options(out, kTp2Rank1)).status().code(),
            absl::StatusCode::kDataLoss);
  LocalizeOptions forced = Options(out, kTp2Rank1);
  forced.force = true;
  ASSERT_TRUE(Localize(*checkpoint, forced).ok());
  EXPECT_TRUE(
      LocalCopy::Open(out, *checkpoint, kTp2Rank1, {.verify_checksums = true})
          .ok());
}

}  // namespace
}  // namespace mneme::engram
