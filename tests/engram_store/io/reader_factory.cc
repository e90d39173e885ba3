#include "tests/engram_store/io/reader_factory.h"

#include "engram_store/io/pread_pool_reader.h"
#include "engram_store/io/uring_row_reader.h"

namespace mneme::engram::testing {

std::string ReaderKindName(ReaderKind kind) {
  switch (kind) {
    case ReaderKind::kPoolInline:
      return "PoolInline";
    case ReaderKind::kPool:
      return "Pool";
    case ReaderKind::kUring:
      return "Uring";
  }
  return "Unknown";
}

absl::StatusOr<std::unique_ptr<RowReader>> MakeReader(ReaderKind kind) {
  switch (kind) {
    case ReaderKind::kPoolInline:
    case ReaderKind::kPool: {
      PreadPoolReaderOptions options;
      options.threads = 4;
      // Small batches, so that a modest test batch spans many of them.
      options.reads_per_task = 4;
      options.inline_max_spans = kind == ReaderKind::kPoolInline ? 1 << 30 : 0;
      absl::StatusOr<std::unique_ptr<PreadPoolReader>> reader =
          PreadPoolReader::Create(options);
      if (!reader.ok()) return reader.status();
      return std::unique_ptr<RowReader>(*std::move(reader));
    }
    case ReaderKind::kUring: {
      UringRowReaderOptions options;
      options.rings = 2;
      options.queue_depth = 32;
      // Small, so that a test batch wraps the buffer many times.
      options.buffer_bytes = 1 << 20;
      absl::StatusOr<std::unique_ptr<UringRowReader>> reader =
          UringRowReader::Create(options);
      if (!reader.ok()) return reader.status();
      return std::unique_ptr<RowReader>(*std::move(reader));
    }
  }
  return absl::InvalidArgumentError("unknown reader kind");
}

}  // namespace mneme::engram::testing
