// libFuzzer target for HTTP request bodies: the first byte picks the endpoint ('0'
// /v1/completions, '1' /v1/chat/completions, '2' /tokenize, '3' /detokenize, '4'
// /apply-template; other bytes by (byte - '0') mod 5, so every byte means one), the rest is
// the body. The body goes through what the server runs before anything reaches
// the engine: parse_request_body, then prepare_generation (sampling fields, prompt, messages,
// tools, tool_choice, response_format and grammar compiled, the chat template rendered and
// tokenized, the n engine requests made) or the token endpoint's handler, whose reply is then
// serialized. The vocabulary is a committed SentencePiece-style fixture
// (tests/data/tokenizers/spm-legacy) and the chat template a ChatML one with Hermes-style tool
// calls, so tool_choice "required" and named functions compile their call grammars too.
// An ApiError with a 4xx status is the expected rejection; any other exception, a 5xx, a
// crash, sanitizer report, leak or hang is a bug.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string_view>

#include "flashdllm/gguf.h"
#include "flashdllm/tokenizer.h"
#include "grammar/grammar_cache.h"
#include "server/chat_renderer.h"
#include "server/generation_request.h"
#include "server/json_fields.h"
#include "server/openai_error.h"
#include "server/token_endpoints.h"

namespace {

using namespace fdl::server;

// Qwen 2.5's layout in brief: tools listed in the system turn, calls as <tool_call> blocks,
// results as <tool_response> in a user turn; a system turn anywhere but first is refused.
constexpr std::string_view kTemplate = R"({%- if tools %}<|im_start|>system
{{ messages[0].content if messages[0].role == 'system' else 'You are a helpful assistant.' }}

# Tools

<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'system' %}{% if not loop.first %}{{ raise_exception('a system message must come first') }}{% endif %}
{%- elif m.role == 'assistant' %}<|im_start|>assistant
{%- if m.content %}
{{ m.content }}{% endif %}
{%- if m.tool_calls %}{% for tc in m.tool_calls %}
<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>
{%- endfor %}{% endif %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %})";

constexpr int kContext = 2048;

struct Server {
  std::unique_ptr<fdl::Tokenizer> tok;
  ServerOptions options;
};

const Server& server() {
  static const Server s = [] {
    Server s;
    s.tok = fdl::Tokenizer::from_gguf(
        fdl::GgufFile::open(FLASHDLLM_SOURCE_DIR "/tests/data/tokenizers/spm-legacy/vocab.gguf"));
    s.options.chat = ChatRenderer::from_jinja(kTemplate, "fuzz");
    return s;
  }();
  return s;
}

void handle(const Server& s, int endpoint, std::string_view text) {
  const nlohmann::json body = parse_request_body(text);
  const nlohmann::ordered_json ordered = parse_request_body_ordered(text);
  switch (endpoint) {
    case 0:
    case 1: {
      fdl::grammar::GrammarCache grammars;
      const PreparedRequest p = prepare_generation(RequestEnv{*s.tok, s.options, grammars, kContext}, body,
                                                   endpoint == 0 ? Endpoint::Completions : Endpoint::Chat,
                                                   &ordered);
      (void)make_engine_requests(p.params, p.prompt_ids, p.extra_stops, /*random_seed=*/0);
      break;
    }
    case 2: (void)dump_json(handle_tokenize(*s.tok, body)); break;
    case 3: (void)dump_json(handle_detokenize(*s.tok, body)); break;
    default: (void)dump_json(handle_apply_template(*s.tok, s.options, body, &ordered)); break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Server& s = server();
  try {
    handle(s, uint8_t(data[0] - '0') % 5, std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  } catch (const ApiError& e) {
    if (e.status() < 400 || e.status() >= 500) __builtin_trap();  // a client's mistake must be a 4xx
  }
  return 0;
}
