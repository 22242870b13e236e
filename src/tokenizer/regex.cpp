#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "flashdllm/tokenizer.h"

namespace fdl::tok {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof buf);
  return n < 0 ? "PCRE2 error " + std::to_string(code) : std::string(reinterpret_cast<char*>(buf));
}

}  // namespace

Regex::Regex(std::string pattern) : pattern_(std::move(pattern)) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
  if (!code)
    throw TokenizerError("pre-tokenizer regex does not compile at offset " +
                         std::to_string(err_offset) + ": " + pcre2_message(err) + " (pattern: " +
                         pattern_ + ")");
  // JIT is an optimisation only: without it (or if it fails) pcre2_match interprets.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = code;
}

Regex::~Regex() {
  if (code_) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

Regex::Regex(Regex&& o) noexcept : pattern_(std::move(o.pattern_)), code_(o.code_) { o.code_ = nullptr; }

Regex& Regex::operator=(Regex&& o) noexcept {
  if (this != &o) {
    if (code_) pcre2_code_free(static_cast<pcre2_code*>(code_));
    pattern_ = std::move(o.pattern_);
    code_ = o.code_;
    o.code_ = nullptr;
  }
  return *this;
}

Regex::Matcher::Matcher(const Regex& re)
    : re_(re),
      match_data_(pcre2_match_data_create_from_pattern(static_cast<pcre2_code*>(re.code_), nullptr)) {
  if (!match_data_) throw std::bad_alloc();
}

Regex::Matcher::~Matcher() { pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data_)); }

std::optional<std::pair<size_t, size_t>> Regex::Matcher::find(std::string_view subject,
                                                               size_t start) {
  auto* md = static_cast<pcre2_match_data*>(match_data_);
  const auto run = [&](uint32_t options) {
    return pcre2_match(static_cast<pcre2_code*>(re_.code_),
                       reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), start,
                       PCRE2_NO_UTF_CHECK | options, md, nullptr);
  };
  int rc = run(0);
  // The JIT's default 32 KiB stack could run out on a giant input where the interpreter
  // (which keeps its backtracking state on the heap) still succeeds.
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) rc = run(PCRE2_NO_JIT);
  if (rc == PCRE2_ERROR_NOMATCH) return std::nullopt;
  if (rc < 0)
    throw TokenizerError("pre-tokenizer regex failed (" + pcre2_message(rc) + ") on a " +
                         std::to_string(subject.size()) + "-byte text; pattern: " + re_.pattern_);
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
  return std::make_pair(static_cast<size_t>(ov[0]), static_cast<size_t>(ov[1]));
}

}  // namespace fdl::tok
