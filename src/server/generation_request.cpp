// Preparing a generation request (generation_request.h).
#include "server/generation_request.h"

#include <utility>

#include "flashdllm/generator.h"
#include "flashdllm/tokenizer.h"
#include "server/chat_renderer.h"
#include "server/chat_request.h"
#include "server/completion_request.h"
#include "server/openai_error.h"
#include "server/response_format.h"
#include "tokenizer/utf8.h"

namespace fdl::server {

using nlohmann::json;

PreparedRequest prepare_generation(const RequestEnv& env, const json& body, Endpoint endpoint,
                                   const nlohmann::ordered_json* ordered) {
  const Tokenizer& tok = env.tok;
  PreparedRequest p{endpoint, {}, {}, {}, {}, {}, {}};
  const char* prompt_param = "prompt";
  if (endpoint == Endpoint::Completions) {
    CompletionRequest r = parse_completion_request(body, tok.n_vocab(), env.options.sampling_defaults);
    p.params = std::move(r.params);
    // Text is plain text (special-token text stays text); ids are used exactly as sent.
    p.prompt_ids = r.prompt_text ? encode_prompt(tok, *r.prompt_text, false) : std::move(r.prompt_ids);
    if (r.echo) p.echo = r.prompt_text ? *r.prompt_text : tok::to_well_formed_utf8(tok.decode(p.prompt_ids));
  } else {
    ChatRequest r = parse_chat_request(body, env.options.sampling_defaults, ordered);  // validated before the config check
    const ChatRenderer& chat = chat_template_or_400(env.options.chat);
    p.params = std::move(r.params);
    p.prompt_ids = encode_chat_or_400(chat, tok, r.messages, r.tools);
    p.extra_stops = chat.stop_strings(tok);
    p.tools = plan_tool_calls(r.tool_choice, r.tools, chat.tool_call_format(), &env.grammars);
    p.params.grammar = p.tools.grammar;  // required / named: the reply is calls
    prompt_param = "messages";
  }
  for (const auto& [token, bias] : p.params.sampling.logit_bias)
    if (token >= tok.n_vocab())
      throw invalid_param("logit_bias", "'logit_bias' token " + std::to_string(token) + " is outside the vocabulary [0, " +
                                            std::to_string(tok.n_vocab()) + ")");
  // The output constraint; a tool choice that already set one (required / named) excludes it.
  if (auto g = parse_output_grammar(body, ordered, env.grammars)) {
    if (p.params.grammar)
      throw invalid_param("response_format", "'response_format' (or 'grammar') cannot be combined with a 'tool_choice' "
                                             "that requires a tool call");
    p.params.grammar = std::move(g);
  }
  if (p.tools.format.syntax != ToolCallSyntax::None) {
    if (p.params.grammar != p.tools.grammar)
      p.tools = ToolCallPlan{};  // response_format constrains the reply: it is that JSON, not calls
    else
      p.params.skip_special_tokens = false;  // markers such as [TOOL_CALLS] are special tokens: keep their text
  }
  // A grammar ends the text itself (end-of-generation where it is complete); the template's
  // end marker as a stop string would only cut a value that happens to contain it.
  if (p.params.grammar) p.extra_stops.clear();
  check_prompt_fits(p.prompt_ids.size(), env.n_ctx, prompt_param);
  return p;
}

}  // namespace fdl::server
