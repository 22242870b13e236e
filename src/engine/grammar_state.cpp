#include "engine/grammar_state.h"

#include <algorithm>

namespace fdl::engine {

std::shared_ptr<grammar::TokenMasker> GrammarMaskers::get(const std::shared_ptr<const Grammar>& g,
                                                          bool render_special) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->grammar == g && it->render_special == render_special) {
      entries_.splice(entries_.begin(), entries_, it);
      return it->masker;
    }
  }
  auto& trie = tries_[render_special ? 1 : 0];
  if (!trie) trie = std::make_shared<const grammar::TokenTrie>(tok_, render_special);
  entries_.push_front(Entry{g, render_special, std::make_shared<grammar::TokenMasker>(g, trie)});
  // Forget the least recently used maskers that no sequence holds, beyond kKeepUnused.
  size_t unused = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    const bool idle = it->masker.use_count() == 1;
    if (idle && ++unused > kKeepUnused) {
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  return entries_.front().masker;
}

size_t GrammarState::constrain_draft(std::vector<int32_t>& draft, size_t max_tokens) {
  GrammarMatcher probe = matcher;
  size_t keep = 0;
  while (keep < draft.size() && keep < max_tokens && masker->accept(probe, draft[keep]))
    ++keep;
  draft.resize(keep);
  if (keep < max_tokens) masker->forced_tokens(probe, std::min(max_tokens - keep, forced_window), draft);
  return keep;
}

void GrammarState::observe_forced(size_t drafted, size_t accepted) {
  if (drafted == 0) return;
  forced_window = accepted >= drafted ? std::min(2 * forced_window, kMaxForcedWindow) : std::max<size_t>(forced_window / 2, 1);
}

}  // namespace fdl::engine
