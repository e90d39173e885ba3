#include "engram_store/client/engram_client.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace mneme::engram {

absl::StatusOr<int32_t> EngramClient::LookupInto(
    const v1::LookupRequest& request, bool stream, absl::Span<uint8_t> rows) {
  absl::StatusOr<v1::LookupResponse> response =
      stream ? LookupStream(request) : Lookup(request);
  if (!response.ok()) return response.status();
  if (response->rows().size() != rows.size()) {
    return absl::DataLossError(
        absl::StrCat("the lookup returned ", response->rows().size(),
                     " bytes of rows, expected ", rows.size()));
  }
  if (!rows.empty()) {
    std::memcpy(rows.data(), response->rows().data(), rows.size());
  }
  return response->row_dim();
}

}  // namespace mneme::engram
