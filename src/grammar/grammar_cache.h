// Internal: compiled grammars by source text, so that requests with the same schema or GBNF
// share one Grammar — and with it the engine's token-mask caches, which are kept per
// grammar (engine/grammar_state.h). Least recently used entries go beyond `capacity`.
// Errors: compile()'s GrammarError propagates (failures are not cached).
// Thread-safety: every method is safe to call from several threads (one mutex).
#pragma once

#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "flashdllm/grammar.h"

namespace fdl::grammar {

class GrammarCache {
 public:
  explicit GrammarCache(size_t capacity = 64) : capacity_(capacity) {}
  /// The compiled grammar of `gbnf` (start rule `root`).
  std::shared_ptr<const Grammar> get(const std::string& gbnf);
  size_t size() const;

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const Grammar>>;
  size_t capacity_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  ///< most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

}  // namespace fdl::grammar
