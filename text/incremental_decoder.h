#ifndef MNEME_TEXT_INCREMENTAL_DECODER_H_
#define MNEME_TEXT_INCREMENTAL_DECODER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "text/tokenizer.h"

namespace mneme::text {

// Turns a stream of token ids into text deltas for streaming. Each Add()
// returns the text the ids so far complete; bytes that start a UTF-8
// character whose remaining bytes have not arrived (a character split across
// byte-level tokens) are held back until they do, so a delta never holds half
// a character. The deltas of Add() followed by Finish() concatenate to
// tokenizer.Decode(all ids, skip).
//
// Call order: Add() for each id, then Finish() at the end of the stream
// (after which Add() starts a new text). One per stream, not thread-safe;
// borrows the tokenizer, which must outlive it.
class IncrementalDecoder {
 public:
  IncrementalDecoder(const Tokenizer& tokenizer, SkipSpecialTokens skip)
      : tokenizer_(tokenizer), skip_(skip) {}

  // The text that `id` completes (possibly empty). Ids without a token and
  // skipped special tokens add nothing, as in Decode().
  std::string Add(int64_t id);

  // The end of the stream: the held-back bytes, with U+FFFD for what never
  // became a character (as Decode() does).
  std::string Finish();

  // Bytes held back now (0 to 3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  const SkipSpecialTokens skip_;
  // Bytes of an incomplete character.
  std::string pending_;
  // Whether a token has been decoded since the start (for the separator).
  bool started_ = false;
};

}  // namespace mneme::text

#endif  // MNEME_TEXT_INCREMENTAL_DECODER_H_
