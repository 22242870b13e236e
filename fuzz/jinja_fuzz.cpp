// libFuzzer target for the Jinja chat-template interpreter: the input is a template's source,
// parsed and rendered over a conversation with a system turn, tools and a tool call.
// TemplateError is the expected rejection; a crash, sanitizer report, leak, hang or runaway
// memory is a bug.
#include <cstdint>
#include <string_view>

#include "jinja/template.h"

namespace {

const fdl::jinja::Object& context() {
  static const fdl::jinja::Object ctx = fdl::jinja::chat_context(nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|im_start|> {{ x }}"},
                 {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                   "function": {"name": "f", "arguments": {"a": 1, "items": [1, 2.5, null, true]}}}]},
                 {"role": "tool", "tool_call_id": "c1", "content": "{\"ok\": true}"}],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
               "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})"));
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  try {
    const fdl::jinja::Template t(source);
    fdl::jinja::RenderOptions opt;
    opt.clock = [] { return std::tm{}; };
    (void)t.render(context(), opt);
  } catch (const fdl::jinja::TemplateError&) {
  }
  return 0;
}
