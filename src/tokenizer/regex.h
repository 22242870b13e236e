// A compiled PCRE2 pattern (UTF + UCP mode, JIT-compiled when the library supports it),
// searched within a sub-range of a subject. Used by the BPE pre-tokenizers.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace fdl::tok {

class Regex {
 public:
  /// Compile `pattern` (PCRE2 syntax, UTF-8). Throws TokenizerError with PCRE2's message and
  /// the offset in the pattern on a syntax error.
  explicit Regex(std::string pattern);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  const std::string& pattern() const { return pattern_; }

  /// Per-thread match state (PCRE2 match data). Create one per search loop.
  class Matcher {
   public:
    explicit Matcher(const Regex& re);
    ~Matcher();
    Matcher(const Matcher&) = delete;
    Matcher& operator=(const Matcher&) = delete;
    /// First match in `subject` starting at or after byte `start` as [begin, end) byte
    /// offsets; std::nullopt when there is none. `subject` must be well-formed UTF-8 and
    /// `start` on a character boundary. Lookarounds and `$` see only `subject`.
    std::optional<std::pair<size_t, size_t>> find(std::string_view subject, size_t start);

   private:
    const Regex& re_;
    void* match_data_;
  };

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
};

}  // namespace fdl::tok
