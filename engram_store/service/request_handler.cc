#include "engram_store/service/request_handler.h"

#include <algorithm>
#include <span>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "engram_store/hashing/column_split.h"
#include "formats/row_format.h"

namespace mneme::engram {
namespace {

absl::StatusOr<RowEncoding> ToEncoding(v1::RowEncoding encoding) {
  switch (encoding) {
    case v1::ROW_ENCODING_UNSPECIFIED:
    case v1::ROW_ENCODING_BF16:
      return RowEncoding::kBf16;
    case v1::ROW_ENCODING_FP32:
      return RowEncoding::kFp32;
    case v1::ROW_ENCODING_RAW:
      return RowEncoding::kRaw;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("encoding: unknown value ", static_cast<int>(encoding)));
  }
}

v1::RowEncoding ToWire(RowEncoding encoding) {
  switch (encoding) {
    case RowEncoding::kFp32:
      return v1::ROW_ENCODING_FP32;
    case RowEncoding::kRaw:
      return v1::ROW_ENCODING_RAW;
    case RowEncoding::kBf16:
      break;
  }
  return v1::ROW_ENCODING_BF16;
}

v1::RowFormat ToWire(formats::RowFormat format) {
  switch (format) {
    case formats::RowFormat::kFp8:
      return v1::ROW_FORMAT_FP8;
    case formats::RowFormat::kNvfp4:
      return v1::ROW_FORMAT_NVFP4;
    case formats::RowFormat::kUnspecified:
      break;
  }
  return v1::ROW_FORMAT_UNSPECIFIED;
}

v1::ColumnSplit ToWire(ColumnSplit split) {
  switch (split) {
    case ColumnSplit::kContiguous:
      return v1::COLUMN_SPLIT_CONTIGUOUS;
    case ColumnSplit::kStrided:
      return v1::COLUMN_SPLIT_STRIDED;
    case ColumnSplit::kUnspecified:
      break;
  }
  return v1::COLUMN_SPLIT_UNSPECIFIED;
}

absl::Status TooMany(int64_t rows, int64_t max_rows) {
  return absl::ResourceExhaustedError(
      absl::StrCat("request asks for ", rows, " rows; the limit is ", max_rows,
                   " per request (split the batch or use LookupStream)"));
}

}  // namespace

absl::StatusOr<ResolvedRequest> RequestHandler::Resolve(
    int32_t layer_id, const google::protobuf::RepeatedField<int64_t>& row_ids,
    const google::protobuf::RepeatedField<int64_t>& token_ids,
    int32_t context_token_count,
    const google::protobuf::RepeatedField<int32_t>& columns,
    v1::RowEncoding encoding, int64_t max_rows) const {
  const EngramCheckpoint& checkpoint = store_->checkpoint();
  ASSIGN_OR_RETURN(const checkpoint::EngramTableLocation* table,
                   checkpoint.Table(layer_id));
  ResolvedRequest out;
  out.layer_id = layer_id;
  ASSIGN_OR_RETURN(RowEncoding enc, ToEncoding(encoding));
  out.encoding = enc;
  out.wire_encoding = ToWire(enc);
  out.row_bytes = EncodedRowBytes(enc, table->format);
  out.row_format = table->format;
  out.global_scale = table->global_scale;

  if (row_ids.empty() == token_ids.empty()) {
    return absl::InvalidArgumentError(
        "exactly one of row_ids and token_ids must be non-empty");
  }
  if (!row_ids.empty()) {
    if (context_token_count != 0 || !columns.empty()) {
      return absl::InvalidArgumentError(
          "context_token_count and columns apply to token_ids only");
    }
    if (row_ids.size() > max_rows) return TooMany(row_ids.size(), max_rows);
    out.row_ids.assign(row_ids.begin(), row_ids.end());
    return out;
  }

  if (context_token_count < 0 || context_token_count >= token_ids.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "context_token_count ", context_token_count,
        " must be in [0, token_ids size ", token_ids.size(),
        "): the window needs at least one token after its context"));
  }
  const NgramHasher& hasher = checkpoint.hasher();
  std::vector<int> cols;
  if (columns.empty()) {
    cols = store_->columns();
  } else {
    absl::flat_hash_set<int> seen;
    for (int32_t c : columns) {
      if (c < 0 || c >= hasher.num_columns()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "column ", c, " is outside [0, ", hasher.num_columns(), ")"));
      }
      if (!seen.insert(c).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("column ", c, " is repeated"));
      }
      if (!std::binary_search(store_->columns().begin(),
                              store_->columns().end(), c)) {
        return absl::OutOfRangeError(
            absl::StrCat("column ", c, " is not served by this store (columns ",
                         absl::StrJoin(store_->columns(), ","), ")"));
      }
      cols.push_back(c);
    }
  }
  const int64_t positions = token_ids.size() - context_token_count;
  const int64_t rows = positions * static_cast<int64_t>(cols.size());
  if (rows > max_rows) return TooMany(rows, max_rows);
  out.row_ids.resize(rows);
  const std::span<const int64_t> all(token_ids.data(), token_ids.size());
  RETURN_IF_ERROR(hasher.ComputeColumnRowIds(
      layer_id, all.first(context_token_count),
      all.subspan(context_token_count), cols, out.row_ids));
  return out;
}

absl::StatusOr<ResolvedRequest> RequestHandler::ResolveLookup(
    const v1::LookupRequest& request, int64_t max_rows) const {
  return Resolve(request.layer_id(), request.row_ids(), request.token_ids(),
                 request.context_token_count(), request.columns(),
                 request.encoding(), max_rows);
}

absl::Status RequestHandler::LookupRowsInto(const ResolvedRequest& resolved,
                                            size_t first, size_t count,
                                            absl::Time deadline,
                                            absl::Span<uint8_t> out) const {
  const absl::Span<const int64_t> ids =
      absl::MakeConstSpan(resolved.row_ids).subspan(first, count);
  if (out.size() != ids.size() * resolved.row_bytes) {
    return absl::InternalError(absl::StrCat("LookupRowsInto: ", out.size(),
                                            " output bytes for ", ids.size(),
                                            " rows of ", resolved.row_bytes));
  }
  return store_->Lookup(resolved.layer_id, ids, resolved.encoding, out,
                        deadline);
}

absl::Status RequestHandler::LookupRows(const ResolvedRequest& resolved,
                                        size_t first, size_t count,
                                        absl::Time deadline,
                                        v1::LookupResponse* response) const {
  const absl::Span<const int64_t> ids =
      absl::MakeConstSpan(resolved.row_ids).subspan(first, count);
  std::string* rows = response->mutable_rows();
  rows->resize(ids.size() * resolved.row_bytes);
  absl::Status s = store_->Lookup(
      resolved.layer_id, ids, resolved.encoding,
      absl::MakeSpan(reinterpret_cast<uint8_t*>(rows->data()), rows->size()),
      deadline);
  if (!s.ok()) {
    response->Clear();
    return s;
  }
  response->set_row_dim(formats::kRowDim);
  response->set_row_bytes(static_cast<int32_t>(resolved.row_bytes));
  response->set_encoding(resolved.wire_encoding);
  response->mutable_row_ids()->Assign(ids.begin(), ids.end());
  response->set_first_row(static_cast<int64_t>(first));
  return absl::OkStatus();
}

absl::Status RequestHandler::Lookup(const v1::LookupRequest& request,
                                    absl::Time deadline,
                                    v1::LookupResponse* response) const {
  ASSIGN_OR_RETURN(ResolvedRequest resolved,
                   ResolveLookup(request, limits_.max_rows_per_request));
  const int64_t bytes = static_cast<int64_t>(resolved.row_ids.size()) *
                        static_cast<int64_t>(resolved.row_bytes);
  if (bytes > limits_.max_response_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the response would hold ", bytes, " bytes (", resolved.row_ids.size(),
        " rows of ", resolved.row_bytes, " bytes in ",
        v1::RowEncoding_Name(resolved.wire_encoding), "); the limit is ",
        limits_.max_response_bytes,
        " per Lookup (ask for fewer rows, a smaller encoding, or use "
        "LookupStream)"));
  }
  return LookupRows(resolved, 0, resolved.row_ids.size(), deadline, response);
}

size_t RequestHandler::RowsPerStreamMessage(
    const ResolvedRequest& resolved) const {
  const int64_t rows = limits_.max_stream_message_bytes /
                       static_cast<int64_t>(resolved.row_bytes);
  return static_cast<size_t>(std::max<int64_t>(rows, 1));
}

absl::Status RequestHandler::Prefetch(const v1::PrefetchRequest& request,
                                      v1::PrefetchResponse* response) const {
  ASSIGN_OR_RETURN(
      ResolvedRequest resolved,
      Resolve(request.layer_id(), request.row_ids(), request.token_ids(),
              request.context_token_count(), request.columns(),
              v1::ROW_ENCODING_RAW, limits_.max_rows_per_request));
  response->set_rows_queued(
      store_->Prefetch(resolved.layer_id, resolved.row_ids));
  return absl::OkStatus();
}

void RequestHandler::Describe(v1::DescribeResponse* response) const {
  const EngramCheckpoint& checkpoint = store_->checkpoint();
  const HashLayout& layout = checkpoint.hasher().layout();
  const checkpoint::EngramConfig& config = checkpoint.config();
  for (size_t t = 0; t < checkpoint.tables().size(); ++t) {
    const checkpoint::EngramTableLocation& loc = checkpoint.tables()[t];
    v1::TableInfo* info = response->add_tables();
    info->set_layer_id(loc.layer);
    info->set_format(ToWire(loc.format));
    info->set_rows(loc.rows);
    info->set_raw_row_bytes(
        static_cast<int32_t>(formats::RowBytes(loc.format)));
    info->set_global_scale(loc.global_scale);
    absl::StatusOr<int> index = layout.LayerIndex(loc.layer);
    if (index.ok()) {
      const LayerHashLayout& l = layout.layers()[*index];
      info->mutable_multipliers()->Assign(l.multipliers.begin(),
                                          l.multipliers.end());
      info->mutable_primes()->Assign(l.primes.begin(), l.primes.end());
      info->mutable_offsets()->Assign(l.offsets.begin(), l.offsets.end());
    }
    for (const RowRange& r : store_->served_ranges()[t]) {
      v1::RowRange* range = info->add_served_ranges();
      range->set_begin(r.begin);
      range->set_end(r.end);
    }
  }
  response->set_row_dim(formats::kRowDim);
  response->set_max_ngram_size(layout.max_ngram_size());
  response->set_n_heads(layout.n_heads());
  response->set_num_columns(layout.num_columns());
  response->set_context_size(checkpoint.hasher().context_size());
  response->set_compressed_vocab_size(config.compressed_vocab_size);
  const EngramStoreOptions& options = store_->options();
  response->set_tp_size(options.tp_size);
  response->mutable_ranks()->Assign(options.ranks.begin(), options.ranks.end());
  response->set_split(ToWire(options.split));
  response->mutable_columns()->Assign(store_->columns().begin(),
                                      store_->columns().end());
  response->set_max_rows_per_request(limits_.max_rows_per_request);
  response->set_max_rows_per_stream(limits_.max_rows_per_stream);
  response->set_max_response_bytes(limits_.max_response_bytes);
  response->set_max_stream_message_bytes(limits_.max_stream_message_bytes);
}

}  // namespace mneme::engram
