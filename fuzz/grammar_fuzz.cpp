// libFuzzer target for grammars: the input is GBNF text, or, when it starts with '{', a JSON
// schema (converted to GBNF first). A grammar that compiles is then driven by the input's
// own bytes: a matcher accepts them one by one and asks for the next bytes at every step.
// GrammarError (and a schema that is not JSON) is the expected rejection; a crash, sanitizer
// report, leak, hang or runaway memory is a bug.
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "flashdllm/grammar.h"
#include "grammar/json_schema.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  try {
    std::string gbnf(input);
    if (!input.empty() && input.front() == '{') {
      const nlohmann::json schema = nlohmann::json::parse(input, nullptr, /*allow_exceptions=*/false);
      if (schema.is_discarded()) return 0;
      gbnf = fdl::grammar::json_schema_to_gbnf(schema);
    }
    const auto g = fdl::Grammar::compile(gbnf);
    fdl::GrammarMatcher m(g);
    for (const char c : input) {
      (void)m.next_bytes();
      if (!m.accept_byte(static_cast<uint8_t>(c))) break;
    }
    (void)m.can_end();
  } catch (const fdl::GrammarError&) {
  }
  return 0;
}
