// Internal: finds stop strings in a stream of generated text (OpenAI `stop` semantics).
//
// Text arrives in pieces (one per token, from the StreamingDetokenizer) and a stop string
// may span pieces. The matcher emits text as soon as it is certain not to be part of a stop
// string: a tail of the stream that is a prefix of some stop string is held back until the
// next piece decides it. When a stop string completes, everything before it is emitted and
// the stop string and anything after it are discarded; the matcher is then "stopped".
// The result never depends on how the text was split into pieces: it is the text before the
// earliest occurrence of any stop string in the whole stream. (So with stops {"b c", " "},
// "ab " is held until the next piece shows whether "b c" starts at the 'b'.)
// If the pieces are whole UTF-8 and the stop strings are valid UTF-8, every emitted chunk is
// whole UTF-8 too (a held tail starts where a stop string starts: a character boundary).
//
// Not thread-safe; one per generated sequence.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace fdl {

class StopMatcher {
 public:
  /// Throws std::invalid_argument for an empty stop string. No stop strings = pass-through.
  explicit StopMatcher(std::vector<std::string> stops);

  /// Feed the next piece; returns the text that is now safe to emit (possibly empty).
  /// After a stop string was found, further pieces are ignored and "" is returned.
  std::string push(std::string_view piece);
  /// End of stream: returns the held-back text up to the earliest stop string it contains
  /// (then stopped() becomes true), or all of it.
  std::string flush();

  bool stopped() const { return stopped_; }
  /// Index in the constructor's list of the stop string that matched; -1 if none.
  int matched_index() const { return matched_; }

 private:
  /// Length of the longest suffix of held_ that is a proper prefix of some stop string.
  size_t longest_partial_tail() const;
  /// Emits what is decided in held_ (see push / flush).
  std::string release(bool end_of_stream);

  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  int matched_ = -1;
};

}  // namespace fdl
