// tool_choice: parsing and refusals, and the plan it makes for a template's syntax; the
// JSON of tool calls in a message and in streamed deltas.
#include <gtest/gtest.h>

#include "server/chat_request.h"
#include "server/openai_error.h"
#include "server/response_json.h"
#include "server/tool_call_parser.h"
#include "server/tool_choice.h"

namespace fdl::server {
namespace {

using nlohmann::json;

const json kTools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "get_time"}}])");

ApiError choice_error(const json& choice, const json* tools = &kTools) {
  try {
    parse_tool_choice({{"tool_choice", choice}}, tools);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for " << choice.dump();
  return ApiError(0, "");
}

TEST(ToolChoice, Parsed) {
  EXPECT_EQ(parse_tool_choice(json::object(), &kTools).mode, ToolChoice::Mode::Auto);
  EXPECT_EQ(parse_tool_choice({{"tool_choice", nullptr}}, &kTools).mode, ToolChoice::Mode::Auto);
  EXPECT_EQ(parse_tool_choice({{"tool_choice", "auto"}}, nullptr).mode, ToolChoice::Mode::Auto);
  EXPECT_EQ(parse_tool_choice({{"tool_choice", "none"}}, nullptr).mode, ToolChoice::Mode::None);
  EXPECT_EQ(parse_tool_choice({{"tool_choice", "required"}}, &kTools).mode, ToolChoice::Mode::Required);
  const ToolChoice named = parse_tool_choice(
      {{"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}}}, &kTools);
  EXPECT_EQ(named.mode, ToolChoice::Mode::Function);
  EXPECT_EQ(named.function, "get_time");
}

TEST(ToolChoice, Refusals) {
  const ApiError unknown = choice_error({{"type", "function"}, {"function", {{"name", "get_wether"}}}});
  EXPECT_EQ(unknown.status(), 400);
  EXPECT_EQ(unknown.param(), "tool_choice");
  EXPECT_NE(std::string(unknown.what()).find("'get_wether'"), std::string::npos) << unknown.what();
  for (const json& bad : {json("sometimes"), json(1), json::array(), json({{"type", "function"}}),
                          json({{"type", "tool"}, {"function", {{"name", "get_time"}}}}),
                          json({{"type", "function"}, {"function", {{"name", 5}}}})})
    EXPECT_EQ(choice_error(bad).param(), "tool_choice") << bad.dump();
  const json empty = json::array();
  EXPECT_EQ(choice_error("required", nullptr).param(), "tool_choice");
  EXPECT_EQ(choice_error("required", &empty).param(), "tool_choice");
  EXPECT_EQ(choice_error({{"type", "function"}, {"function", {{"name", "get_time"}}}}, nullptr).param(), "tool_choice");
}

TEST(ToolChoice, ThroughTheChatRequest) {
  const json body = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                     {"tools", kTools},
                     {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}};
  const ChatRequest r = parse_chat_request(body);
  EXPECT_EQ(r.tool_choice.mode, ToolChoice::Mode::Function);
  EXPECT_EQ(r.tools.size(), 2u);
  // "none": the reply is not read for calls, but the template still gets the tools (some
  // templates refuse tool turns without them).
  json none = body;
  none["tool_choice"] = "none";
  EXPECT_EQ(parse_chat_request(none).tools.size(), 2u);
  EXPECT_EQ(parse_chat_request(none).tool_choice.mode, ToolChoice::Mode::None);
  // parallel_tool_calls: a boolean, true by default.
  EXPECT_TRUE(r.tool_choice.parallel);
  json single = body;
  single["parallel_tool_calls"] = false;
  EXPECT_FALSE(parse_chat_request(single).tool_choice.parallel);
  single["parallel_tool_calls"] = "no";
  EXPECT_THROW(parse_chat_request(single), ApiError);
  json unknown = body;
  unknown["tool_choice"]["function"]["name"] = "nope";
  EXPECT_THROW(parse_chat_request(unknown), ApiError);
}

// Tool names: OpenAI's rule plus '.' and ':', checked where the request is read, so that a
// call the grammar forces always parses back as a call, never as content.
TEST(ToolChoice, ToolNamesAreCheckedAndDistinct) {
  auto body_with = [](const std::vector<std::string>& names) {
    json tools = json::array();
    for (const std::string& n : names) tools.push_back({{"type", "function"}, {"function", {{"name", n}}}});
    return json{{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"tools", tools}, {"tool_choice", "required"}};
  };
  const std::vector<std::string> good = {"get_weather", "a", "Z-9", "ns.sub:fn_1", std::string(64, 'x')};
  EXPECT_NO_THROW(parse_chat_request(body_with(good)));
  for (const std::string& name : good) {
    const ParsedReply r = parse_tool_calls(ToolCallFormat{ToolCallSyntax::MistralNameArgs, true},
                                           "[TOOL_CALLS]" + name + "[ARGS]{}", {name});
    ASSERT_EQ(r.calls.size(), 1u) << name;
    EXPECT_EQ(r.calls[0].name, name);
    EXPECT_EQ(r.content, "");
  }
  // Strings, not char pointers: a pointer into a temporary string would dangle in the loop.
  const std::vector<std::string> bad_names = {"", "get weather", "caf\xC3\xA9", "a/b", "f\n", "<tool_call>",
                                              "f[ARGS]", std::string(65, 'x')};
  for (const std::string& bad : bad_names) {
    try {
      parse_chat_request(body_with({"get_time", bad}));
      ADD_FAILURE() << "no error for '" << bad << "'";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_EQ(e.param(), "tools");
      EXPECT_NE(std::string(e.what()).find("'tools[1].function.name' must be 1 to 64 characters"), std::string::npos)
          << e.what();
    }
  }
  try {
    parse_chat_request(body_with({"get_time", "get_weather", "get_time"}));
    ADD_FAILURE() << "no error for a repeated name";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "tools");
    EXPECT_NE(std::string(e.what()).find("'tools[2].function.name' repeats the name 'get_time' of tools[0]"),
              std::string::npos)
        << e.what();
  }
}

TEST(ToolChoice, Plans) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(kTools.dump());
  const ToolCallFormat hermes{ToolCallSyntax::Hermes};
  const ToolChoice automatic, none{ToolChoice::Mode::None, ""}, required{ToolChoice::Mode::Required, ""},
      named{ToolChoice::Mode::Function, "get_time"};

  const ToolCallPlan a = plan_tool_calls(automatic, tools, hermes);
  EXPECT_EQ(a.format, hermes);
  EXPECT_EQ(a.names, (std::vector<std::string>{"get_weather", "get_time"}));
  EXPECT_EQ(a.grammar, nullptr);
  EXPECT_NE(plan_tool_calls(required, tools, hermes).grammar, nullptr);
  EXPECT_NE(plan_tool_calls(named, tools, hermes).grammar, nullptr);
  EXPECT_EQ(plan_tool_calls(none, tools, hermes).format.syntax, ToolCallSyntax::None);
  EXPECT_EQ(plan_tool_calls(automatic, nullptr, hermes).format.syntax, ToolCallSyntax::None);
  // parallel_tool_calls false: one call kept, and "required" enforces one.
  EXPECT_EQ(a.max_calls, SIZE_MAX);
  ToolChoice one = automatic, one_required = required;
  one.parallel = one_required.parallel = false;
  EXPECT_EQ(plan_tool_calls(one, tools, hermes).max_calls, 1u);
  const ToolCallPlan r1 = plan_tool_calls(one_required, tools, hermes);
  EXPECT_EQ(r1.max_calls, 1u);
  GrammarMatcher m(r1.grammar);
  const std::string call = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  EXPECT_TRUE(m.accept_bytes(call));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.accept_bytes("\n<"));  // no second call

  // A template without a known syntax: "auto" leaves the reply as text; enforcing is a 400.
  EXPECT_EQ(plan_tool_calls(automatic, tools, ToolCallFormat{}).format.syntax, ToolCallSyntax::None);
  try {
    plan_tool_calls(required, tools, ToolCallFormat{});
    FAIL() << "expected a 400";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "tool_choice");
  }
}

TEST(ToolCallJson, MessageCallsAndStreamedDeltas) {
  const json tool_calls = tool_calls_json({ToolCall{"call_1", "get_time", "{}", 0}});
  EXPECT_EQ(tool_calls, json::parse(R"([{"id": "call_1", "type": "function",
                                         "function": {"name": "get_time", "arguments": "{}"}}])"));
  ToolCallEvent begin{ToolCallEvent::Kind::CallBegin, 2, "", "call_9", "get_weather"};
  EXPECT_EQ(tool_call_delta(begin), json::parse(R"({"tool_calls": [{"index": 2, "id": "call_9", "type": "function",
                                                   "function": {"name": "get_weather", "arguments": ""}}]})"));
  ToolCallEvent args{ToolCallEvent::Kind::CallArguments, 2, "{\"ci", "", ""};
  EXPECT_EQ(tool_call_delta(args),
            json::parse(R"({"tool_calls": [{"index": 2, "function": {"arguments": "{\"ci"}}]})"));
  EXPECT_EQ(tool_call_delta({ToolCallEvent::Kind::Content, 0, "Hi", "", ""}), json({{"content", "Hi"}}));
  EXPECT_EQ(tool_call_delta({ToolCallEvent::Kind::CallFailed, 1, "<tool_call>x", "", ""}),
            json({{"content", "<tool_call>x"}}));
}

}  // namespace
}  // namespace fdl::server
