#ifndef MNEME_COMMON_STATUS_MACROS_H_
#define MNEME_COMMON_STATUS_MACROS_H_

// The one way to propagate an absl::Status or absl::StatusOr in Mneme.
//
//   RETURN_IF_ERROR(WriteHeader(fd));
//   ASSIGN_OR_RETURN(std::unique_ptr<Reader> reader, Reader::Create(options));
//   ASSIGN_OR_RETURN(auto header, ParseHeader(bytes));
//
// Both return the error unchanged from the enclosing function, which must
// return absl::Status or absl::StatusOr<T>. `lhs` of ASSIGN_OR_RETURN may be a
// declaration or an existing variable; it cannot contain an unparenthesised
// comma (use a type alias or `auto`). Each ASSIGN_OR_RETURN declares a hidden
// temporary named after its line, so two cannot share a line.

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MNEME_STATUS_MACROS_CONCAT_INNER_(a, b) a##b
#define MNEME_STATUS_MACROS_CONCAT_(a, b) \
  MNEME_STATUS_MACROS_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                            \
  do {                                                   \
    ::absl::Status mneme_status_macros_status_ = (expr); \
    if (!mneme_status_macros_status_.ok()) {             \
      return mneme_status_macros_status_;                \
    }                                                    \
  } while (false)

#define ASSIGN_OR_RETURN(lhs, rexpr)                                       \
  MNEME_ASSIGN_OR_RETURN_IMPL_(                                            \
      MNEME_STATUS_MACROS_CONCAT_(mneme_status_macros_or_, __LINE__), lhs, \
      rexpr)

#define MNEME_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) {                                    \
    return std::move(statusor).status();                   \
  }                                                        \
  lhs = *std::move(statusor)

#endif  // MNEME_COMMON_STATUS_MACROS_H_
