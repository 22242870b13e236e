#include "tokenizer/pre_tokenizer.h"

#include <array>
#include <utility>

#include "flashdllm/tokenizer.h"
#include "tokenizer/utf8.h"

namespace fdl::tok {
namespace {

// Unicode White_Space, as PCRE2 class items.
constexpr std::string_view kWhitespaceItems =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

bool is_whitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

/// Rewrite `\s` / `\S` in `pattern` to explicit White_Space classes.
std::string expand_whitespace(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      ++i;
      if (e == 's') {
        if (in_class) {
          out += kWhitespaceItems;
        } else {
          out += '[';
          out += kWhitespaceItems;
          out += ']';
        }
      } else if (e == 'S' && !in_class) {
        out += "[^";
        out += kWhitespaceItems;
        out += ']';
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[' && !in_class) in_class = true;
    else if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

// --- The regexes (from the models' tokenizer.json pre_tokenizer sections) ---

// GPT-2 (OpenAI encoder.py), with the final `\s+` alternative that llama.cpp's hand-written
// matcher for it also has.
constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3 (tiktoken cl100k-style); `(?i:'s|...)` spelled out case by case.
constexpr std::string_view kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2: Llama 3's with single digits.
constexpr std::string_view kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Tekken (Mistral Nemo, Mistral Small 3). Its tokenizer.json splits letter runs by Unicode case
// ([\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+ | ...+...*); llama.cpp runs its
// rewrite with "a letter that is not a-z" / "not A-Z" instead, so only ASCII letters have a case
// and combining marks are not letters. The rewrite is what llama.cpp tokenizes with, so it is
// the one used here.
constexpr std::string_view kTekken =
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// CJK ideographs, U+0800..U+4E00 and Hangul, minus White_Space (see the header).
constexpr std::string_view kDeepseekCjk =
    R"([\x{4E00}-\x{9FA5}\x{0800}-\x{167F}\x{1681}-\x{1FFF}\x{200B}-\x{2027}\x{202A}-\x{202E}\x{2030}-\x{205E}\x{2060}-\x{2FFF}\x{3001}-\x{4E00}\x{AC00}-\x{D7FF}]+)";
// DeepSeek LLM: cased letters (the explicit list of its tokenizer.json).
constexpr std::string_view kDeepseekLlmLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293})"
    R"(\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A})"
    R"(\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556})"
    R"(\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF})"
    R"(\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D})"
    R"(\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D})"
    R"(\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3})"
    R"(\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107})"
    R"(\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D})"
    R"(\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184})"
    R"(\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D})"
    R"(\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF})"
    R"(\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F})"
    R"(\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2})"
    R"(\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";
// DeepSeek LLM: ASCII and full-width punctuation/symbols, curly quotes, CJK full stop/comma.
constexpr std::string_view kDeepseekLlmPunct =
    R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3001}-\x{3002}]+)";

/// The regex list of each kind; an empty string stands for "split off trailing whitespace".
std::vector<std::string_view> regexes_of(PreTokenizerKind kind) {
  switch (kind) {
    case PreTokenizerKind::Gpt2: return {kGpt2};
    case PreTokenizerKind::Llama3: return {kLlama3};
    case PreTokenizerKind::Qwen2: return {kQwen2};
    case PreTokenizerKind::Tekken: return {kTekken};
    case PreTokenizerKind::Falcon: return {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"};
    case PreTokenizerKind::Starcoder: return {R"(\p{N})", kGpt2};
    case PreTokenizerKind::DeepseekLlm:
      return {R"([\r\n])", kDeepseekLlmLetters, kDeepseekLlmPunct, "", kDeepseekCjk, R"(\p{N}+)"};
    case PreTokenizerKind::DeepseekCoder:
      return {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, R"(\p{N})"};
    case PreTokenizerKind::Default:
      return {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"};
  }
  return {};
}

struct PreName {
  std::string_view name;
  PreTokenizerConfig config;
};

constexpr PreTokenizerConfig cfg(PreTokenizerKind k, bool ignore_merges = false, bool add_bos = false) {
  return {k, ignore_merges, add_bos};
}

const std::array<PreName, 26>& pre_names() {
  using K = PreTokenizerKind;
  static const std::array<PreName, 26> names = {{
      {"default", cfg(K::Default)},
      {"gpt-2", cfg(K::Gpt2)},
      {"phi-2", cfg(K::Gpt2)},
      {"mpt", cfg(K::Gpt2)},
      {"olmo", cfg(K::Gpt2)},
      {"jais", cfg(K::Gpt2)},
      {"llama3", cfg(K::Llama3, true, true)},
      {"llama-v3", cfg(K::Llama3, true, true)},
      {"llama-bpe", cfg(K::Llama3, true, true)},
      {"falcon3", cfg(K::Llama3, true, true)},
      {"dbrx", cfg(K::Llama3)},
      {"smaug-bpe", cfg(K::Llama3)},
      {"qwen2", cfg(K::Qwen2)},
      {"deepseek-r1-qwen", cfg(K::Qwen2)},
      {"stablelm2", cfg(K::Qwen2)},
      {"megrez", cfg(K::Qwen2)},
      {"falcon", cfg(K::Falcon)},
      {"starcoder", cfg(K::Starcoder)},
      {"refact", cfg(K::Starcoder)},
      {"command-r", cfg(K::Starcoder)},
      {"smollm", cfg(K::Starcoder)},
      {"codeshell", cfg(K::Starcoder)},
      {"exaone", cfg(K::Starcoder)},
      {"deepseek-llm", cfg(K::DeepseekLlm)},
      {"deepseek-coder", cfg(K::DeepseekCoder)},
      {"tekken", cfg(K::Tekken, true, true)},
  }};
  return names;
}

/// Byte offset where the run of White_Space characters ending `s` (well-formed UTF-8)
/// begins.
size_t trailing_whitespace_start(std::string_view s) {
  size_t start = s.size();
  while (start > 0) {
    size_t p = start - 1;
    while (p > 0 && (static_cast<uint8_t>(s[p]) & 0xC0) == 0x80) --p;  // back to a lead byte
    uint32_t cpt = static_cast<uint8_t>(s[p]);
    if (start - p > 1) {
      cpt &= 0x3F >> (start - p - 1);  // payload bits of the lead byte
      for (size_t k = p + 1; k < start; ++k) cpt = (cpt << 6) | (static_cast<uint8_t>(s[k]) & 0x3F);
    }
    if (!is_whitespace(cpt)) break;
    start = p;
  }
  return start;
}

}  // namespace

std::string supported_pre_tokenizers() {
  std::string s;
  for (const PreName& n : pre_names()) {
    if (!s.empty()) s += ", ";
    s += n.name;
  }
  return s;
}

PreTokenizerConfig resolve_pre_tokenizer(std::string_view pre) {
  if (pre.empty()) return cfg(PreTokenizerKind::Default);
  for (const PreName& n : pre_names())
    if (n.name == pre) return n.config;
  throw TokenizerError("unsupported pre-tokenizer 'tokenizer.ggml.pre' = '" + std::string(pre) +
                       "'; supported: " + supported_pre_tokenizers());
}

PreTokenizer::PreTokenizer(PreTokenizerKind kind) {
  for (std::string_view re : regexes_of(kind)) {
    Step step;
    if (!re.empty()) step.regex = std::make_unique<Regex>(expand_whitespace(re));
    steps_.push_back(std::move(step));
  }
}

void PreTokenizer::split(std::string_view text, std::vector<std::string>& words) const {
  if (text.empty()) return;
  // `subject` is what the regexes see; `normalised` is what the chunks are cut from. They
  // have the same length per code point: only surrogates (encodable, but not valid UTF-8 for
  // PCRE2) differ, and both spell them with 3 bytes.
  std::string subject_storage, normalised_storage;
  std::string_view subject = text, normalised = text;
  if (!is_well_formed_utf8(text)) {
    for (uint32_t cpt : decode_utf8_lenient(text)) {
      append_utf8(normalised_storage, cpt);
      const bool surrogate = cpt >= 0xD800 && cpt <= 0xDFFF;
      append_utf8(subject_storage, surrogate ? kReplacementChar : cpt);
    }
    subject = subject_storage;
    normalised = normalised_storage;
  }

  std::vector<std::pair<size_t, size_t>> chunks{{0, subject.size()}}, next;  // [begin, end)
  for (const Step& step : steps_) {
    next.clear();
    std::optional<Regex::Matcher> matcher;
    if (step.regex) matcher.emplace(*step.regex);
    for (const auto& [begin, end] : chunks) {
      const std::string_view chunk = subject.substr(begin, end - begin);
      if (!matcher) {
        const size_t ws = trailing_whitespace_start(chunk);
        if (ws > 0) next.emplace_back(begin, begin + ws);
        if (ws < chunk.size()) next.emplace_back(begin + ws, end);
        continue;
      }
      size_t done = 0;  // end of the last piece emitted, relative to the chunk
      size_t pos = 0;
      while (pos < chunk.size()) {
        const auto m = matcher->find(chunk, pos);
        if (!m) break;
        auto [mb, me] = *m;
        if (me == mb) {  // never produced by our patterns; step over one character
          pos = mb + utf8_step(chunk, mb).length;
          continue;
        }
        if (mb > done) next.emplace_back(begin + done, begin + mb);
        next.emplace_back(begin + mb, begin + me);
        done = pos = me;
      }
      if (done < chunk.size()) next.emplace_back(begin + done, end);
    }
    chunks.swap(next);
  }
  for (const auto& [begin, end] : chunks) words.emplace_back(normalised.substr(begin, end - begin));
}

}  // namespace fdl::tok
