#include "engram_store/local_copy/local_copy.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engram_store/local_copy/range_checksum.h"

namespace mneme::engram {
namespace {

// Manifests are a few KB per layer; anything near this is not one.
constexpr uint64_t kMaxManifestBytes = 64ull << 20;
constexpr size_t kVerifyBufferBytes = 8u << 20;

}  // namespace

absl::StatusOr<LocalCopyManifest> ReadLocalCopyManifest(
    const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kLocalCopyManifestFileName);
  ASSIGN_OR_RETURN(bool dir_exists, PathExists(dir));
  if (!dir_exists) {
    return absl::NotFoundError(absl::StrCat("no local copy at '", dir,
                                            "': the directory does not exist"));
  }
  absl::StatusOr<std::string> text = ReadSmallFile(path, kMaxManifestBytes);
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(absl::StrCat(
        "no local copy at '", dir, "': ", kLocalCopyManifestFileName,
        " is missing (an unfinished `mneme localize` leaves none; run it "
        "again to finish)"));
  }
  if (!text.ok()) return text.status();
  return ParseManifest(*text, path);
}

absl::StatusOr<std::unique_ptr<LocalCopy>> LocalCopy::Open(
    const std::string& dir, const EngramCheckpoint& source,
    const LocalCopyTarget& target, const LocalCopyOpenOptions& options) {
  RETURN_IF_ERROR(ValidateTarget(target));
  ASSIGN_OR_RETURN(LocalCopyManifest manifest, ReadLocalCopyManifest(dir));
  ASSIGN_OR_RETURN(SourceIdentity identity, IdentifySource(source));
  // The range size only changes how rows are split into entries, which the
  // comparison ignores.
  ASSIGN_OR_RETURN(
      LocalCopyManifest expected,
      PlanLocalCopy(source, identity, target, /*max_range_bytes=*/1ull << 40));
  RETURN_IF_ERROR(CheckManifestMatches(manifest, expected, dir));

  auto copy = std::unique_ptr<LocalCopy>(new LocalCopy());
  copy->dir_ = dir;
  copy->manifest_ = std::move(manifest);
  copy->files_.reserve(copy->manifest_.layers.size());
  for (const LocalCopyLayer& layer : copy->manifest_.layers) {
    LayerFile file;
    file.layer = &layer;
    file.path = absl::StrCat(dir, "/", layer.data_file);
    ASSIGN_OR_RETURN(ScopedFd fd, OpenForRead(file.path));
    ASSIGN_OR_RETURN(uint64_t size, FileSize(fd.get(), file.path));
    if (size != layer.data_bytes()) {
      return absl::DataLossError(
          absl::StrCat("local copy data file '", file.path, "' is ", size,
                       " bytes, the manifest says ", layer.data_bytes()));
    }
    file.fd = std::move(fd);
    copy->files_.push_back(std::move(file));
  }
  if (options.verify_checksums) {
    RETURN_IF_ERROR(copy->VerifyChecksums(options.verify_page_cache));
  }
  return copy;
}

const LocalCopy::LayerFile* LocalCopy::FindFile(int layer) const {
  for (const LayerFile& file : files_) {
    if (file.layer->layer == layer) return &file;
  }
  return nullptr;
}

std::optional<uint64_t> LocalCopy::Locate(int layer, int64_t row) const {
  const LayerFile* file = FindFile(layer);
  if (file == nullptr) return std::nullopt;
  const std::vector<LocalCopyRange>& ranges = file->layer->ranges;
  // The first range starting after `row`; the one before it is the only
  // candidate.
  auto it = std::upper_bound(ranges.begin(), ranges.end(), row,
                             [](int64_t r, const LocalCopyRange& range) {
                               return r < range.first_row;
                             });
  if (it == ranges.begin()) return std::nullopt;
  --it;
  if (row >= it->end_row()) return std::nullopt;
  return it->offset +
         static_cast<uint64_t>(row - it->first_row) * file->layer->row_bytes();
}

const LocalCopyLayer* LocalCopy::Layer(int layer) const {
  const LayerFile* file = FindFile(layer);
  return file == nullptr ? nullptr : file->layer;
}

absl::StatusOr<std::string> LocalCopy::DataPath(int layer) const {
  const LayerFile* file = FindFile(layer);
  if (file == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("local copy '", dir_, "' has no Engram layer ", layer));
  }
  return file->path;
}

int LocalCopy::DataFd(int layer) const {
  const LayerFile* file = FindFile(layer);
  return file == nullptr ? -1 : file->fd.get();
}

absl::Status LocalCopy::ReadRawRows(int layer, absl::Span<const int64_t> ids,
                                    absl::Span<uint8_t> out) const {
  const LayerFile* file = FindFile(layer);
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("local copy '", dir_, "' has no Engram layer ", layer));
  }
  const uint64_t row_bytes = file->layer->row_bytes();
  if (out.size() != ids.size() * row_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("output holds ", out.size(), " bytes, ", ids.size(),
                     " rows need ", ids.size() * row_bytes));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::optional<uint64_t> offset = Locate(layer, ids[i]);
    if (!offset.has_value()) {
      return absl::OutOfRangeError(
          absl::StrCat("row ", ids[i], " of layer ", layer,
                       " is not in local copy '", dir_, "'"));
    }
    RETURN_IF_ERROR(PreadFully(file->fd.get(), *offset,
                               out.subspan(i * row_bytes, row_bytes),
                               file->path));
  }
  return absl::OkStatus();
}

absl::Status LocalCopy::VerifyChecksums(PageCachePolicy page_cache) const {
  std::vector<uint8_t> buffer(kVerifyBufferBytes);
  for (const LayerFile& file : files_) {
    const uint64_t row_bytes = file.layer->row_bytes();
    for (const LocalCopyRange& range : file.layer->ranges) {
      ASSIGN_OR_RETURN(
          uint32_t crc,
          Crc32cOfFileRange(file.fd.get(), range.offset,
                            static_cast<uint64_t>(range.count) * row_bytes,
                            file.path, absl::MakeSpan(buffer), page_cache));
      if (crc != range.crc32c) {
        return absl::DataLossError(absl::StrCat(
            "local copy '", dir_, "': layer ", file.layer->layer, " rows [",
            range.first_row, ", ", range.end_row(), ") in '", file.path,
            "' fail their checksum (run mneme localize again to repair)"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace mneme::engram
