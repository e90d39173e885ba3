#ifndef MNEME_TESTS_ENGRAM_STORE_IO_READER_FACTORY_H_
#define MNEME_TESTS_ENGRAM_STORE_IO_READER_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engram_store/io/row_reader.h"

namespace mneme::engram::testing {

// The RowReader configurations the tests run over.
enum class ReaderKind {
  kPoolInline,  // PreadPoolReader, batches of kBuffered files inline.
  kPool,        // PreadPoolReader, every batch through 4 workers.
  kUring,       // UringRowReader.
};

std::string ReaderKindName(ReaderKind kind);

// Unavailable from UringRowReader::Create where io_uring is not allowed.
absl::StatusOr<std::unique_ptr<RowReader>> MakeReader(ReaderKind kind);

}  // namespace mneme::engram::testing

#endif  // MNEME_TESTS_ENGRAM_STORE_IO_READER_FACTORY_H_
