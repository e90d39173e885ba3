#include "engram_store/local_copy/local_copy_writer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/file_io.h"
#include "common/status_macros.h"
#include "engram_store/local_copy/crc32c.h"
#include "engram_store/local_copy/local_copy.h"
#include "engram_store/local_copy/localize_journal.h"

namespace mneme::engram {
namespace {

using localize_internal::AppendAll;
using localize_internal::ErrnoError;
using localize_internal::JournalContents;
using localize_internal::JournalEntryLine;
using localize_internal::KeyOf;
using localize_internal::kJournalMagic;
using localize_internal::MakeDirs;
using localize_internal::RangeKey;
using localize_internal::ReadJournal;
using localize_internal::RemoveIfExists;
using localize_internal::SyncDir;

constexpr int kMaxThreads = 64;
constexpr uint64_t kMaxChunkBytes = 1ull << 30;

// ---------------------------------------------------------------------------

absl::Status ValidateOptions(const LocalizeOptions& options) {
  if (options.out_dir.empty()) {
    return absl::InvalidArgumentError("out_dir is required");
  }
  RETURN_IF_ERROR(ValidateTarget(options.target));
  if (options.threads < 1 || options.threads > kMaxThreads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "threads must be in [1, ", kMaxThreads, "], got ", options.threads));
  }
  if (options.chunk_bytes < 1 || options.chunk_bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes must be in [1, ", kMaxChunkBytes, "], got ",
                     options.chunk_bytes));
  }
  if (options.max_range_bytes < 1) {
    return absl::InvalidArgumentError("max_range_bytes must be >= 1");
  }
  if (options.page_cache != PageCachePolicy::kKeep &&
      options.page_cache != PageCachePolicy::kRelease) {
    return absl::InvalidArgumentError("page_cache is unspecified");
  }
  return absl::OkStatus();
}

LocalizeSummary Summarize(const LocalCopyManifest& manifest) {
  LocalizeSummary summary;
  for (const LocalCopyLayer& layer : manifest.layers) {
    LocalizeSummary::Layer s;
    s.layer = layer.layer;
    s.format = layer.format;
    s.rows = layer.covered_rows();
    s.bytes = layer.data_bytes();
    s.ranges = static_cast<int64_t>(layer.ranges.size());
    summary.rows += s.rows;
    summary.bytes += s.bytes;
    summary.ranges += s.ranges;
    summary.layers.push_back(s);
  }
  return summary;
}

// A range to bring into the copy and, when an earlier run already did, the
// checksum it recorded.
struct Candidate {
  uint32_t crc32c = 0;
  // Already verified by this run.
  bool verified = false;
};

// The source tensors and the data file of one layer.
struct LayerIo {
  const checkpoint::EngramTableLocation* table = nullptr;
  ScopedFd weights;
  ScopedFd scales;
  std::string data_path;
  ScopedFd data;
};

// Buffers of one copying thread.
struct Buffers {
  std::vector<uint8_t> weights;
  std::vector<uint8_t> scales;
  std::vector<uint8_t> raw;
};

// One Localize() call after validation.
class LocalizeRun {
 public:
  LocalizeRun(const EngramCheckpoint& source, const LocalizeOptions& options)
      : source_(source), options_(options), start_(absl::Now()) {}

  absl::StatusOr<LocalizeSummary> Run();

 private:
  // Checks the existing manifest and journal; fills candidates_. Sets
  // *complete when out_dir already holds a verified copy of the plan.
  absl::Status Prepare(bool* complete);
  absl::Status OpenLayers(int data_flags);
  // Verifies the ranges of a complete manifest matching the plan; fills
  // candidates_ with the good ones. Returns whether all are good.
  absl::StatusOr<bool> VerifyExisting(const LocalCopyManifest& existing);
  absl::Status WriteJournal();
  absl::Status CopyAll();
  absl::Status DoRange(size_t layer_index, size_t range_index,
                       Buffers& buffers);
  absl::StatusOr<uint32_t> CopyRange(const LayerIo& io,
                                     const LocalCopyRange& range,
                                     Buffers& buffers) const;
  absl::Status Finish();
  // Runs fn(task) for tasks [0, n) on up to options_.threads threads, each
  // with its own Buffers; stops at the first error (returned).
  absl::Status ParallelFor(
      size_t n, const std::function<absl::Status(size_t, Buffers&)>& fn) const;

  const EngramCheckpoint& source_;
  const LocalizeOptions& options_;
  const absl::Time start_;
  std::string manifest_path_;
  std::string journal_path_;
  ScopedFd dir_fd_;
  SourceIdentity identity_;
  // The copy being made; checksums are filled in as ranges complete (each
  // task writes only its own entry).
  LocalCopyManifest plan_;
  std::map<RangeKey, Candidate> candidates_;
  std::vector<LayerIo> layers_;
  ScopedFd journal_fd_;

  absl::Mutex mu_;
  LocalizeProgress progress_ ABSL_GUARDED_BY(mu_);
  int64_t ranges_copied_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t ranges_reused_ ABSL_GUARDED_BY(mu_) = 0;
};

absl::Status LocalizeRun::ParallelFor(
    size_t n, const std::function<absl::Status(size_t, Buffers&)>& fn) const {
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  absl::Mutex error_mu;
  absl::Status error;
  auto worker = [&] {
    Buffers buffers;
    while (!stop.load()) {
      const size_t task = next.fetch_add(1);
      if (task >= n) break;
      absl::Status s = fn(task, buffers);
      if (!s.ok()) {
        absl::MutexLock lock(&error_mu);
        if (error.ok()) error = std::move(s);
        stop.store(true);
      }
    }
  };
  const size_t threads =
      std::min<size_t>(static_cast<size_t>(options_.threads), n);
  std::vector<std::thread> pool;
  for (size_t i = 1; i < threads; ++i) pool.emplace_back(worker);
  if (threads > 0) worker();
  for (std::thread& t : pool) t.join();
  absl::MutexLock lock(&error_mu);
  return error;
}

absl::Status LocalizeRun::OpenLayers(int data_flags) {
  layers_.clear();
  for (const LocalCopyLayer& layer : plan_.layers) {
    ASSIGN_OR_RETURN(const checkpoint::EngramTableLocation* table,
                     source_.Table(layer.layer));
    LayerIo io;
    io.table = table;
    ASSIGN_OR_RETURN(ScopedFd weights, OpenForRead(io.table->shard_path));
    ASSIGN_OR_RETURN(ScopedFd scales, OpenForRead(io.table->scale_shard_path));
    io.weights = std::move(weights);
    io.scales = std::move(scales);
    // Advice only.
    (void)::posix_fadvise(io.weights.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
    (void)::posix_fadvise(io.scales.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
    io.data_path = absl::StrCat(options_.out_dir, "/", layer.data_file);
    int fd;
    do {
      fd = ::open(io.data_path.c_str(), data_flags | O_CLOEXEC, 0644);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return ErrnoError(errno, "cannot open", io.data_path);
    io.data = ScopedFd(fd);
    layers_.push_back(std::move(io));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> LocalizeRun::VerifyExisting(
    const LocalCopyManifest& existing) {
  struct Task {
    const LocalCopyLayer* layer;
    const LocalCopyRange* range;
    int fd;
    const std::string* path;
  };
  std::vector<ScopedFd> fds;
  std::vector<std::string> paths;
  paths.reserve(existing.layers.size());
  std::vector<Task> tasks;
  bool all_good = true;
  for (const LocalCopyLayer& layer : existing.layers) {
    paths.push_back(absl::StrCat(options_.out_dir, "/", layer.data_file));
    absl::StatusOr<ScopedFd> fd = OpenForRead(paths.back());
    if (!fd.ok()) {
      if (!absl::IsNotFound(fd.status())) return fd.status();
      all_good = false;  // recopied below
      continue;
    }
    for (const LocalCopyRange& range : layer.ranges) {
      tasks.push_back(Task{&layer, &range, fd->get(), &paths.back()});
    }
    fds.push_back(*std::move(fd));
  }
  std::vector<char> good(tasks.size(), 0);
  absl::Status status = ParallelFor(
      tasks.size(), [&](size_t i, Buffers& buffers) -> absl::Status {
        const Task& task = tasks[i];
        if (buffers.raw.empty()) buffers.raw.resize(options_.chunk_bytes);
        absl::StatusOr<uint32_t> crc = Crc32cOfFileRange(
            task.fd, task.range->offset,
            static_cast<uint64_t>(task.range->count) * task.layer->row_bytes(),
            *task.path, absl::MakeSpan(buffers.raw), options_.page_cache);
        // A short file is a bad range, not a failed run.
        if (absl::IsDataLoss(crc.status())) return absl::OkStatus();
        if (!crc.ok()) return crc.status();
        good[i] = *crc == task.range->crc32c ? 1 : 0;
        return absl::OkStatus();
      });
  if (!status.ok()) return status;
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (good[i] == 0) {
      all_good = false;
      continue;
    }
    const LocalCopyLayer* planned = plan_.FindLayer(tasks[i].layer->layer);
    if (planned != nullptr && planned->data_file == tasks[i].layer->data_file) {
      candidates_[KeyOf(tasks[i].layer->layer, *tasks[i].range)] =
          Candidate{.crc32c = tasks[i].range->crc32c, .verified = true};
    }
  }
  return all_good;
}

absl::Status LocalizeRun::Prepare(bool* complete) {
  *complete = false;
  const std::string force_hint =
      "; pass --force (LocalizeOptions::force) to replace it";
  absl::StatusOr<LocalCopyManifest> existing =
      ReadLocalCopyManifest(options_.out_dir);
  bool have_manifest = false;
  if (existing.ok()) {
    absl::Status match =
        CheckManifestMatches(*existing, plan_, options_.out_dir);
    if (match.ok()) {
      have_manifest = true;
    } else if (!options_.force) {
      return absl::FailedPreconditionError(
          absl::StrCat(match.message(), force_hint));
    }
  } else if (!absl::IsNotFound(existing.status()) && !options_.force) {
    return absl::Status(existing.status().code(),
                        absl::StrCat(existing.status().message(), force_hint));
  }

  if (have_manifest) {
    bool all_good = true;
    if (options_.verify) {
      ASSIGN_OR_RETURN(bool verified, VerifyExisting(*existing));
      all_good = verified;
    }
    if (all_good) {
      // The same copy, intact; a journal left by a crash after the manifest
      // was written is stale.
      *complete = true;
      return RemoveIfExists(journal_path_);
    }
  } else {
    ASSIGN_OR_RETURN(std::optional<JournalContents> journal,
                     ReadJournal(journal_path_));
    if (journal.has_value() && journal->plan.has_value()) {
      const LocalCopyManifest& old_plan = *journal->plan;
      if (!(old_plan.target == plan_.target) && !options_.force) {
        return absl::FailedPreconditionError(absl::StrCat(
            "'", options_.out_dir, "' holds an unfinished copy of ",
            DescribeTarget(old_plan.target), ", not ",
            DescribeTarget(plan_.target), force_hint));
      }
      // A journal of another source is stale: its ranges are recopied.
      if (CheckManifestMatches(old_plan, plan_, options_.out_dir).ok()) {
        for (const auto& [key, crc] : journal->entries) {
          const LocalCopyLayer* planned = plan_.FindLayer(std::get<0>(key));
          const LocalCopyLayer* old_layer =
              old_plan.FindLayer(std::get<0>(key));
          if (planned == nullptr || old_layer == nullptr ||
              planned->data_file != old_layer->data_file) {
            continue;
          }
          candidates_[key] = Candidate{.crc32c = crc, .verified = false};
        }
      }
    }
  }
  // Keep only candidates that are ranges of this plan.
  std::map<RangeKey, Candidate> planned;
  for (const LocalCopyLayer& layer : plan_.layers) {
    for (const LocalCopyRange& range : layer.ranges) {
      auto it = candidates_.find(KeyOf(layer.layer, range));
      if (it != candidates_.end()) planned.insert(*it);
    }
  }
  candidates_ = std::move(planned);
  return absl::OkStatus();
}

absl::Status LocalizeRun::WriteJournal() {
  std::string text =
      absl::StrCat(kJournalMagic, ManifestToCompactJson(plan_), "\n");
  for (const auto& [key, candidate] : candidates_) {
    LocalCopyRange range{.first_row = std::get<1>(key),
                         .count = std::get<2>(key),
                         .offset = std::get<3>(key),
                         .crc32c = candidate.crc32c};
    absl::StrAppend(&text, JournalEntryLine(std::get<0>(key), range));
  }
  RETURN_IF_ERROR(WriteFileAtomically(journal_path_, text));
  int fd;
  do {
    fd = ::open(journal_path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoError(errno, "cannot open", journal_path_);
  journal_fd_ = ScopedFd(fd);
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> LocalizeRun::CopyRange(const LayerIo& io,
                                                const LocalCopyRange& range,
                                                Buffers& buffers) const {
  const checkpoint::EngramTableLocation& t = *io.table;
  const uint64_t w = t.weight_row_bytes;
  const uint64_t s = t.scale_row_bytes;
  const uint64_t row_bytes = w + s;
  const int64_t chunk_rows = static_cast<int64_t>(
      std::max<uint64_t>(1, options_.chunk_bytes / row_bytes));
  buffers.weights.resize(static_cast<size_t>(chunk_rows * w));
  buffers.scales.resize(static_cast<size_t>(chunk_rows * s));
  if (buffers.raw.size() < static_cast<size_t>(chunk_rows * row_bytes)) {
    buffers.raw.resize(static_cast<size_t>(chunk_rows * row_bytes));
  }
  uint32_t crc = 0;
  for (int64_t done = 0; done < range.count;) {
    const int64_t n = std::min(chunk_rows, range.count - done);
    const uint64_t row = static_cast<uint64_t>(range.first_row + done);
    const uint64_t weight_offset = t.weight_offset + row * w;
    const uint64_t scale_offset = t.scale_offset + row * s;
    const size_t weight_bytes = static_cast<size_t>(n * w);
    const size_t scale_bytes = static_cast<size_t>(n * s);
    const size_t raw_bytes = static_cast<size_t>(n * row_bytes);
    RETURN_IF_ERROR(PreadFully(
        io.weights.get(), weight_offset,
        absl::MakeSpan(buffers.weights.data(), weight_bytes), t.shard_path));
    RETURN_IF_ERROR(
        PreadFully(io.scales.get(), scale_offset,
                   absl::MakeSpan(buffers.scales.data(), scale_bytes),
                   t.scale_shard_path));
    MaybeReleasePages(io.weights.get(), weight_offset, weight_bytes,
                      options_.page_cache);
    MaybeReleasePages(io.scales.get(), scale_offset, scale_bytes,
                      options_.page_cache);
    uint8_t* raw = buffers.raw.data();
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(raw + i * row_bytes, buffers.weights.data() + i * w, w);
      std::memcpy(raw + i * row_bytes + w, buffers.scales.data() + i * s, s);
    }
    const absl::Span<const uint8_t> chunk(raw, raw_bytes);
    crc = ExtendCrc32c(crc, chunk);
    RETURN_IF_ERROR(PwriteFully(
        io.data.get(), range.offset + static_cast<uint64_t>(done) * row_bytes,
        chunk, io.data_path));
    done += n;
  }
  const uint64_t bytes = static_cast<uint64_t>(range.count) * row_bytes;
  if (::fdatasync(io.data.get()) != 0) {
    return ErrnoError(errno, "fdatasync", io.data_path);
  }
  MaybeReleasePages(io.data.get(), range.offset, bytes, options_.page_cache);
  if (options_.verify) {
    ASSIGN_OR_RETURN(
        uint32_t written,
        Crc32cOfFileRange(io.data.get(), range.offset, bytes, io.data_path,
                          absl::MakeSpan(buffers.raw), options_.page_cache));
    if (written != crc) {
      return absl::DataLossError(absl::StrFormat(
          "layer %d rows [%d, %d) read back from '%s' differ from the source "
          "(CRC-32C %08x, source %08x)",
          t.layer, range.first_row, range.end_row(), io.data_path, written,
          crc));
    }
  }
  return crc;
}

absl::Status LocalizeRun::DoRange(size_t layer_index, size_t range_index,
                                  Buffers& buffers) {
  const LayerIo& io = layers_[layer_index];
  LocalCopyLayer& layer = plan_.layers[layer_index];
  LocalCopyRange& range = layer.ranges[range_index];
  const uint64_t bytes = static_cast<uint64_t>(range.count) * layer.row_bytes();
  if (buffers.raw.empty()) buffers.raw.resize(options_.chunk_bytes);

  bool reused = false;
  auto candidate = candidates_.find(KeyOf(layer.layer, range));
  if (candidate != candidates_.end()) {
    if (candidate->second.verified || !options_.verify) {
      reused = true;
    } else {
      absl::StatusOr<uint32_t> crc =
          Crc32cOfFileRange(io.data.get(), range.offset, bytes, io.data_path,
                            absl::MakeSpan(buffers.raw), options_.page_cache);
      if (!crc.ok() && !absl::IsDataLoss(crc.status())) return crc.status();
      reused = crc.ok() && *crc == candidate->second.crc32c;
    }
  }
  if (reused) {
    range.crc32c = candidate->second.crc32c;
  } else {
    ASSIGN_OR_RETURN(uint32_t crc, CopyRange(io, range, buffers));
    range.crc32c = crc;
  }

  absl::MutexLock lock(&mu_);
  if (!reused) {
    RETURN_IF_ERROR(AppendAll(journal_fd_.get(),
                              JournalEntryLine(layer.layer, range),
                              journal_path_));
    ++ranges_copied_;
    progress_.bytes_copied += bytes;
  } else {
    ++ranges_reused_;
  }
  ++progress_.ranges_done;
  progress_.bytes_done += bytes;
  progress_.elapsed = absl::Now() - start_;
  if (options_.on_range_done) return options_.on_range_done(progress_);
  return absl::OkStatus();
}

absl::Status LocalizeRun::CopyAll() {
  std::vector<std::pair<size_t, size_t>> tasks;
  uint64_t total_bytes = 0;
  for (size_t l = 0; l < plan_.layers.size(); ++l) {
    for (size_t r = 0; r < plan_.layers[l].ranges.size(); ++r) {
      tasks.emplace_back(l, r);
    }
    total_bytes += plan_.layers[l].data_bytes();
  }
  {
    absl::MutexLock lock(&mu_);
    progress_.ranges_total = static_cast<int64_t>(tasks.size());
    progress_.bytes_total = total_bytes;
  }
  return ParallelFor(tasks.size(), [&](size_t i, Buffers& buffers) {
    return DoRange(tasks[i].first, tasks[i].second, buffers);
  });
}

absl::Status LocalizeRun::Finish() {
  for (LayerIo& io : layers_) {
    if (::fdatasync(io.data.get()) != 0) {
      return ErrnoError(errno, "fdatasync", io.data_path);
    }
    RETURN_IF_ERROR(io.data.Close(io.data_path));
  }
  RETURN_IF_ERROR(SyncDir(dir_fd_.get(), options_.out_dir));
  ASSIGN_OR_RETURN(SourceIdentity now, IdentifySource(source_));
  if (std::optional<std::string> diff =
          DescribeSourceMismatch(identity_, now)) {
    return absl::AbortedError(absl::StrCat(
        "the checkpoint changed during the copy (", *diff, "); run again"));
  }
  RETURN_IF_ERROR(WriteFileAtomically(manifest_path_, ManifestToJson(plan_)));
  RETURN_IF_ERROR(SyncDir(dir_fd_.get(), options_.out_dir));
  RETURN_IF_ERROR(journal_fd_.Close(journal_path_));
  return RemoveIfExists(journal_path_);
}

absl::StatusOr<LocalizeSummary> LocalizeRun::Run() {
  RETURN_IF_ERROR(MakeDirs(options_.out_dir));
  struct stat out_st;
  struct stat source_st;
  if (::stat(options_.out_dir.c_str(), &out_st) != 0) {
    return ErrnoError(errno, "cannot stat", options_.out_dir);
  }
  if (::stat(source_.dir().c_str(), &source_st) != 0) {
    return ErrnoError(errno, "cannot stat", source_.dir());
  }
  if (out_st.st_dev == source_st.st_dev && out_st.st_ino == source_st.st_ino) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", options_.out_dir,
                     "' is the checkpoint directory; the copy needs a "
                     "directory of its own"));
  }
  int dir_fd;
  do {
    dir_fd =
        ::open(options_.out_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  } while (dir_fd < 0 && errno == EINTR);
  if (dir_fd < 0) return ErrnoError(errno, "cannot open", options_.out_dir);
  dir_fd_ = ScopedFd(dir_fd);
  // Filesystems without flock support (ENOLCK, EINVAL) run unlocked.
  if (::flock(dir_fd_.get(), LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    return absl::UnavailableError(absl::StrCat(
        "another mneme localize is writing '", options_.out_dir, "'"));
  }
  manifest_path_ =
      absl::StrCat(options_.out_dir, "/", kLocalCopyManifestFileName);
  journal_path_ =
      absl::StrCat(options_.out_dir, "/", kLocalCopyJournalFileName);

  ASSIGN_OR_RETURN(SourceIdentity identity, IdentifySource(source_));
  identity_ = std::move(identity);
  ASSIGN_OR_RETURN(LocalCopyManifest plan,
                   PlanLocalCopy(source_, identity_, options_.target,
                                 options_.max_range_bytes));
  plan_ = std::move(plan);

  bool complete = false;
  RETURN_IF_ERROR(Prepare(&complete));
  if (complete) {
    ASSIGN_OR_RETURN(LocalCopyManifest existing,
                     ReadLocalCopyManifest(options_.out_dir));
    LocalizeSummary summary = Summarize(existing);
    summary.ranges_reused = summary.ranges;
    summary.elapsed = absl::Now() - start_;
    summary.manifest_path = manifest_path_;
    return summary;
  }

  // From here the directory is an unfinished copy until the manifest is
  // written again. The journal goes first so that no verified range is
  // forgotten if this run stops early.
  RETURN_IF_ERROR(WriteJournal());
  RETURN_IF_ERROR(RemoveIfExists(manifest_path_));
  RETURN_IF_ERROR(OpenLayers(O_RDWR | O_CREAT));
  for (size_t l = 0; l < plan_.layers.size(); ++l) {
    const LocalCopyLayer& layer = plan_.layers[l];
    const LayerIo& io = layers_[l];
    const bool any_candidate = std::any_of(
        layer.ranges.begin(), layer.ranges.end(), [&](const LocalCopyRange& r) {
          return candidates_.contains(KeyOf(layer.layer, r));
        });
    // Without candidates nothing old is kept: drop stale bytes (and blocks).
    if (!any_candidate && ::ftruncate(io.data.get(), 0) != 0) {
      return ErrnoError(errno, "cannot truncate", io.data_path);
    }
    if (::ftruncate(io.data.get(), static_cast<off_t>(layer.data_bytes())) !=
        0) {
      return ErrnoError(errno, "cannot size", io.data_path);
    }
  }
  RETURN_IF_ERROR(CopyAll());
  RETURN_IF_ERROR(Finish());

  // What was written must open as the store will open it.
  absl::StatusOr<std::unique_ptr<LocalCopy>> check =
      LocalCopy::Open(options_.out_dir, source_, options_.target);
  if (!check.ok()) {
    return absl::InternalError(absl::StrCat(
        "the copy just written does not open: ", check.status().message()));
  }
  LocalizeSummary summary = Summarize(plan_);
  {
    absl::MutexLock lock(&mu_);
    summary.ranges_copied = ranges_copied_;
    summary.ranges_reused = ranges_reused_;
    summary.bytes_copied = progress_.bytes_copied;
  }
  summary.elapsed = absl::Now() - start_;
  summary.manifest_path = manifest_path_;
  return summary;
}

}  // namespace

absl::StatusOr<LocalizeSummary> Localize(const EngramCheckpoint& source,
                                         const LocalizeOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  LocalizeRun run(source, options);
  return run.Run();
}

absl::StatusOr<LocalizeSummary> Localize(const LocalizeOptions& options) {
  if (options.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("checkpoint_dir is required");
  }
  RETURN_IF_ERROR(ValidateOptions(options));
  ASSIGN_OR_RETURN(std::unique_ptr<EngramCheckpoint> source,
                   EngramCheckpoint::Open(options.checkpoint_dir));
  return Localize(*source, options);
}

}  // namespace mneme::engram
