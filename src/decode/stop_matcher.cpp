// StopMatcher (see stop_matcher.h). The held text is always shorter than the longest stop
// string plus one piece, so the naive searches below run on a few dozen bytes per token.
#include "decode/stop_matcher.h"

#include <algorithm>
#include <stdexcept>

namespace fdl {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (size_t i = 0; i < stops_.size(); ++i)
    if (stops_[i].empty())
      throw std::invalid_argument("stop string #" + std::to_string(i) + " is empty");
}

size_t StopMatcher::longest_partial_tail() const {
  size_t best = 0;
  for (const auto& stop : stops_) {
    const size_t max_len = std::min(stop.size() - 1, held_.size());
    for (size_t len = max_len; len > best; --len) {
      if (std::string_view(held_).substr(held_.size() - len) ==
          std::string_view(stop).substr(0, len)) {
        best = len;
        break;
      }
    }
  }
  return best;
}

std::string StopMatcher::push(std::string_view piece) {
  if (stopped_) return {};
  if (stops_.empty()) return std::string(piece);
  held_.append(piece);
  return release(/*end_of_stream=*/false);
}

std::string StopMatcher::flush() {
  if (stopped_ || stops_.empty()) return {};
  std::string out = release(/*end_of_stream=*/true);
  held_.clear();
  return out;
}

std::string StopMatcher::release(bool end_of_stream) {
  size_t match = std::string::npos;
  int which = -1;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t at = held_.find(stops_[i]);
    if (at < match) {
      match = at;
      which = int(i);
    }
  }
  // Where a stop string may still be starting (the held tail); at end of stream nothing is.
  const size_t tail = end_of_stream ? 0 : longest_partial_tail();
  const size_t partial_start = tail > 0 ? held_.size() - tail : std::string::npos;

  // A complete match decides the cut unless a stop string that starts even earlier may
  // still complete: then the result must not depend on where the pieces were split, so
  // wait for more text.
  const bool earlier_may_start =
      partial_start != std::string::npos && partial_start < match;
  if (match != std::string::npos && !earlier_may_start) {
    stopped_ = true;
    matched_ = which;
    std::string out = held_.substr(0, match);
    held_.clear();
    return out;
  }
  const size_t cut = std::min(held_.size(), partial_start);
  std::string out = held_.substr(0, cut);
  held_.erase(0, cut);
  return out;
}

}  // namespace fdl
