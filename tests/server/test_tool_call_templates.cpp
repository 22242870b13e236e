// Tool calls through real chat templates: the syntax each template writes is detected, and a
// call rendered by the template (an assistant turn with tool_calls) parses back to the same
// call and is a sentence of the tool-call grammar: the parser and the grammar read exactly
// what the template writes.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <optional>

#include "flashdllm/gguf.h"
#include "flashdllm/grammar.h"
#include "flashdllm/tokenizer.h"
#include "server/chat_renderer.h"
#include "server/tool_call_grammar.h"
#include "server/tool_call_parser.h"
#include "test_support.h"

namespace fdl::server {
namespace {

using nlohmann::ordered_json;

std::string read_template(const std::string& name) {
  std::ifstream in(test::shared_dir() / "chat-templates" / "templates" / name, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

ChatRenderer renderer(const std::string& name) { return ChatRenderer::from_jinja(read_template(name), name); }

TEST(ToolCallFormat, DetectedFromRealTemplates) {
  struct Case {
    const char* file;
    ToolCallFormat format;
  };
  const Case cases[] = {
      {"meta-llama-Llama-3.1-8B-Instruct.jinja", {ToolCallSyntax::Llama3Json}},
      {"meta-llama-Llama-3.2-3B-Instruct.jinja", {ToolCallSyntax::Llama3Json}},
      {"meta-llama-Llama-3.3-70B-Instruct.jinja", {ToolCallSyntax::Llama3Json}},
      {"Qwen-Qwen2.5-7B-Instruct.jinja", {ToolCallSyntax::Hermes}},
      {"Qwen-Qwen3-0.6B.jinja", {ToolCallSyntax::Hermes}},
      {"Qwen-QwQ-32B.jinja", {ToolCallSyntax::Hermes}},
      {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", {ToolCallSyntax::Hermes}},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", {ToolCallSyntax::Hermes}},
      {"ibm-granite-granite-4.0.jinja", {ToolCallSyntax::Hermes}},
      {"mistralai-Mistral-Nemo-Instruct-2407.jinja", {ToolCallSyntax::MistralJsonArray, true}},
      {"Mistral-Small-3.2-24B-Instruct-2506.jinja", {ToolCallSyntax::MistralNameArgs, true, true}},
      {"unsloth-mistral-Devstral-Small-2507.jinja", {ToolCallSyntax::MistralNameArgs}},
      {"mistralai-Ministral-3-14B-Reasoning-2512.jinja", {ToolCallSyntax::MistralNameArgs}},
      // Other syntaxes (XML-style arguments, functools, Command-R actions) and no tools.
      {"Qwen3-Coder.jinja", {}},
      {"GLM-4.6.jinja", {}},
      {"fireworks-ai-llama-3-firefunction-v2.jinja", {}},
      {"CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", {}},
      {"google-gemma-2-2b-it.jinja", {}},
      {"microsoft-Phi-3.5-mini-instruct.jinja", {}},
  };
  for (const Case& c : cases) {
    const ToolCallFormat got = renderer(c.file).tool_call_format();
    EXPECT_EQ(got.syntax, c.format.syntax) << c.file << ": " << tool_call_syntax_name(got.syntax);
    EXPECT_EQ(got.nine_char_ids, c.format.nine_char_ids) << c.file;
    EXPECT_EQ(got.call_id_marker, c.format.call_id_marker) << c.file;
  }
  EXPECT_EQ(ChatRenderer::from_builtin(ChatTemplate::ChatML).tool_call_format().syntax, ToolCallSyntax::None);
  EXPECT_NE(renderer("Qwen-Qwen2.5-7B-Instruct.jinja").describe().find("tool calls: hermes"), std::string::npos);
}

const ordered_json& tools() {
  static const ordered_json t = ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
      "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "days": {"type": "integer", "description": "Days ahead"},
        "units": {"type": "object", "description": "Units", "properties": {"temp": {"type": "string", "enum": ["C", "F"]}}}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "The time now",
      "parameters": {"type": "object", "properties": {}}}}])");
  return t;
}

ordered_json call(const char* id, const char* name, const char* arguments) {
  return {{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", ordered_json::parse(arguments)}}}};
}

struct RoundTrip {
  const char* file;
  const char* vocab;      // for bos/eos text
  const char* end;        // what ends the assistant turn
  bool several;           // the template renders several calls in one turn
  const char* content = "";  // what the turn holds besides the calls (Qwen 3: an empty think block)
};

class TemplateRoundTrip : public ::testing::TestWithParam<RoundTrip> {};

// The text the model would write for `calls`: the assistant turn the template renders after
// the generation prompt, up to the end of the turn.
std::string rendered_reply(const ChatRenderer& chat, const Tokenizer& tok, const std::string& end,
                           const ordered_json& calls) {
  const std::vector<ChatMessage> asked = {{"user", "Weather in Z\xC3\xBCrich, and the time?"}};
  std::vector<ChatMessage> answered = asked;
  answered.push_back({"assistant", "", "", "", calls});
  const std::string prompt = chat.render(tok, asked, tools());
  const std::string full = chat.render(tok, answered, tools());
  EXPECT_EQ(full.substr(0, prompt.size()), prompt) << "the turn does not continue the generation prompt";
  std::string reply = full.substr(prompt.size());
  const size_t at = reply.find(end);
  EXPECT_NE(at, std::string::npos) << reply;
  return reply.substr(0, at);
}

TEST_P(TemplateRoundTrip, RenderedCallsParseBackAndMatchTheGrammar) {
  const RoundTrip& rt = GetParam();
  const ChatRenderer chat = renderer(rt.file);
  const auto tok = Tokenizer::from_gguf(GgufFile::open(test::shared_dir() / "llama-cpp-vocab-fixtures" / rt.vocab));
  const ToolCallFormat format = chat.tool_call_format();
  ASSERT_NE(format.syntax, ToolCallSyntax::None);

  ordered_json calls = ordered_json::array(
      {call("abcDEF123", "get_weather", R"({"city": "Z\u00fcrich", "days": 2, "units": {"temp": "C"}})")});
  if (rt.several) calls.push_back(call("ghiJKL456", "get_time", "{}"));
  const std::string reply = rendered_reply(chat, *tok, rt.end, calls);

  const ParsedReply parsed = parse_tool_calls(format, reply, {"get_weather", "get_time"});
  EXPECT_EQ(parsed.content, rt.content) << reply;
  ASSERT_EQ(parsed.calls.size(), calls.size()) << reply;
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(parsed.calls[i].name, calls[i]["function"]["name"]) << reply;
    EXPECT_EQ(nlohmann::json::parse(parsed.calls[i].arguments),
              nlohmann::json::parse(calls[i]["function"]["arguments"].dump()))
        << reply;
  }
  // The ids the server makes pass the template: the parsed calls, sent back, render.
  ordered_json sent_back = ordered_json::array();
  for (const ToolCall& c : parsed.calls)
    sent_back.push_back(call(c.id.c_str(), c.name.c_str(), c.arguments.c_str()));
  EXPECT_EQ(rendered_reply(chat, *tok, rt.end, sent_back).empty(), false);

  // The grammar of tool_choice "required" accepts the template's text, and refuses it cut short.
  // (The grammar makes the reply only calls: a thinking model's think block is left out.)
  std::string_view only_calls = reply;
  only_calls.remove_prefix(std::string_view(rt.content).size());
  while (!only_calls.empty() && std::isspace(static_cast<unsigned char>(only_calls.front()))) only_calls.remove_prefix(1);
  GrammarMatcher required(Grammar::compile(tool_call_gbnf(format, tools(), std::nullopt)));
  EXPECT_TRUE(required.accept_bytes(only_calls)) << reply;
  EXPECT_TRUE(required.can_end()) << reply;
  GrammarMatcher cut(Grammar::compile(tool_call_gbnf(format, tools(), std::nullopt)));
  ASSERT_TRUE(cut.accept_bytes(only_calls.substr(0, only_calls.size() - 1)));
  EXPECT_FALSE(cut.can_end()) << reply;
  if (!rt.several) {  // a named function's grammar: exactly one call of it
    GrammarMatcher named(Grammar::compile(tool_call_gbnf(format, tools(), std::string("get_weather"))));
    EXPECT_TRUE(named.accept_bytes(only_calls) && named.can_end()) << reply;
    GrammarMatcher other(Grammar::compile(tool_call_gbnf(format, tools(), std::string("get_time"))));
    EXPECT_FALSE(other.accept_bytes(only_calls)) << reply;
  }
}

INSTANTIATE_TEST_SUITE_P(
    RealTemplates, TemplateRoundTrip,
    ::testing::Values(RoundTrip{"meta-llama-Llama-3.1-8B-Instruct.jinja", "ggml-vocab-llama-bpe.gguf", "<|eot_id|>", false},
                      RoundTrip{"meta-llama-Llama-3.2-3B-Instruct.jinja", "ggml-vocab-llama-bpe.gguf", "<|eot_id|>", false},
                      RoundTrip{"Qwen-Qwen2.5-7B-Instruct.jinja", "ggml-vocab-qwen2.gguf", "<|im_end|>", true},
                      RoundTrip{"Qwen-Qwen2.5-7B-Instruct.jinja", "ggml-vocab-qwen2.gguf", "<|im_end|>", false},
                      RoundTrip{"Qwen-Qwen3-0.6B.jinja", "ggml-vocab-qwen2.gguf", "<|im_end|>", true,
                                "<think>\n\n</think>"},
                      RoundTrip{"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "ggml-vocab-llama-bpe.gguf",
                                "<|im_end|>", true},
                      RoundTrip{"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "ggml-vocab-llama-bpe.gguf",
                                "<|im_end|>", false},
                      RoundTrip{"mistralai-Mistral-Nemo-Instruct-2407.jinja", "ggml-vocab-llama-spm.gguf", "</s>", true},
                      RoundTrip{"mistralai-Mistral-Nemo-Instruct-2407.jinja", "ggml-vocab-llama-spm.gguf", "</s>", false},
                      RoundTrip{"Mistral-Small-3.2-24B-Instruct-2506.jinja", "ggml-vocab-llama-spm.gguf", "</s>", true},
                      RoundTrip{"unsloth-mistral-Devstral-Small-2507.jinja", "ggml-vocab-llama-spm.gguf", "</s>", true},
                      RoundTrip{"mistralai-Ministral-3-14B-Reasoning-2512.jinja", "ggml-vocab-llama-spm.gguf", "</s>",
                                false}),
    [](const ::testing::TestParamInfo<RoundTrip>& info) {
      std::string name = std::string(info.param.file).substr(0, std::string(info.param.file).find('.'));
      for (char& c : name)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      return name + "_" + std::to_string(info.index);
    });

}  // namespace
}  // namespace fdl::server
