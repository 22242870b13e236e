#include "grammar/grammar_cache.h"

namespace fdl::grammar {

std::shared_ptr<const Grammar> GrammarCache::get(const std::string& gbnf) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (const auto it = index_.find(gbnf); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  // Compiled outside the lock: a large grammar must not hold up other requests.
  std::shared_ptr<const Grammar> g = Grammar::compile(gbnf);
  std::lock_guard<std::mutex> lock(mu_);
  if (const auto it = index_.find(gbnf); it != index_.end()) return it->second->second;  // raced: keep the first
  lru_.emplace_front(gbnf, g);
  index_[gbnf] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return g;
}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

}  // namespace fdl::grammar
