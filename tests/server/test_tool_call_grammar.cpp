// The grammar of tool_choice "required" and named functions, per syntax: it accepts exactly
// the template's call text with arguments valid under each function's schema, and what it
// accepts the parser reads back as those calls.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "flashdllm/grammar.h"
#include "server/openai_error.h"
#include "server/tool_call_grammar.h"
#include "server/tool_call_parser.h"

namespace fdl::server {
namespace {

using nlohmann::ordered_json;

const ordered_json& tools() {
  static const ordered_json t = ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}, "days": {"type": "integer"}},
      "required": ["city"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "get_time"}}])");
  return t;
}

bool accepts(const ToolCallFormat& f, std::optional<std::string> only, const std::string& text, bool parallel = true) {
  GrammarMatcher m(Grammar::compile(tool_call_gbnf(f, tools(), std::move(only), parallel)));
  return m.accept_bytes(text) && m.can_end();
}

struct Syntax {
  ToolCallFormat format;
  std::string weather, time;  // one call of each, as the template writes them
  std::string separator;      // between two calls of one reply ("" where none is allowed)
  std::string open, close;    // around the calls
};

std::vector<Syntax> syntaxes() {
  return {
      {{ToolCallSyntax::Hermes},
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>",
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
       "\n", "", ""},
      {{ToolCallSyntax::Llama3Json},
       "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
       "{\"name\": \"get_time\", \"parameters\": {}}",
       "", "", ""},
      {{ToolCallSyntax::MistralJsonArray, true},
       "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abcDEF123\"}",
       "{\"name\": \"get_time\", \"arguments\": {}}",
       ", ", "[TOOL_CALLS][", "]"},
      {{ToolCallSyntax::MistralNameArgs, true, true},
       "[TOOL_CALLS]get_weather[CALL_ID]abcDEF123[ARGS]{\"city\":\"Paris\",\"days\":0}",
       "[TOOL_CALLS]get_time[ARGS]{}",
       "", "", ""},
      {{ToolCallSyntax::MistralNameArgs},
       "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\", \"days\": -2}",
       "[TOOL_CALLS]get_time[ARGS]{}",
       "", "", ""},
  };
}

TEST(ToolCallGrammar, AcceptsTheTemplatesCallsAndTheParserReadsThem) {
  for (const Syntax& s : syntaxes()) {
    const std::string name(tool_call_syntax_name(s.format.syntax));
    const std::string weather = s.open + s.weather + s.close, time = s.open + s.time + s.close;
    EXPECT_TRUE(accepts(s.format, std::nullopt, weather)) << name;
    EXPECT_TRUE(accepts(s.format, std::nullopt, time)) << name;
    EXPECT_TRUE(accepts(s.format, "get_weather", weather)) << name;
    EXPECT_FALSE(accepts(s.format, "get_time", weather)) << name;
    EXPECT_FALSE(accepts(s.format, "get_weather", time)) << name;
    const ParsedReply r = parse_tool_calls(s.format, weather, {"get_weather", "get_time"});
    ASSERT_EQ(r.calls.size(), 1u) << name;
    EXPECT_EQ(r.calls[0].name, "get_weather") << name;
    EXPECT_EQ(r.content, "") << name;

    // Several calls: for "required" where the syntax has them, never for a named function.
    if (s.format.syntax != ToolCallSyntax::Llama3Json) {
      const std::string two = s.open + s.weather + s.separator + s.time + s.close;
      EXPECT_TRUE(accepts(s.format, std::nullopt, two)) << name;
      EXPECT_FALSE(accepts(s.format, "get_weather", two)) << name;
      // parallel_tool_calls false: one call of any tool, never two.
      EXPECT_FALSE(accepts(s.format, std::nullopt, two, /*parallel=*/false)) << name;
      EXPECT_TRUE(accepts(s.format, std::nullopt, weather, /*parallel=*/false)) << name;
      EXPECT_TRUE(accepts(s.format, std::nullopt, time, /*parallel=*/false)) << name;
      EXPECT_EQ(parse_tool_calls(s.format, two, {"get_weather", "get_time"}).calls.size(), 2u) << name;
    }
    // Not calls: text around them, cut short, a function that is not a tool.
    EXPECT_FALSE(accepts(s.format, std::nullopt, "Sure. " + weather)) << name;
    EXPECT_FALSE(accepts(s.format, std::nullopt, weather + " ok")) << name;
    EXPECT_FALSE(accepts(s.format, std::nullopt, weather.substr(0, weather.size() - 1))) << name;
    std::string other = weather;
    other.replace(other.find("get_weather"), 11, "get_wetter");
    EXPECT_FALSE(accepts(s.format, std::nullopt, other)) << name;
  }
}

TEST(ToolCallGrammar, ArgumentsFollowTheSchema) {
  const ToolCallFormat hermes{ToolCallSyntax::Hermes};
  auto call = [](const std::string& name, const std::string& args) {
    return "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + args + "}\n</tool_call>";
  };
  EXPECT_TRUE(accepts(hermes, std::nullopt, call("get_weather", R"({"city":"Oslo","days":12})")));
  EXPECT_FALSE(accepts(hermes, std::nullopt, call("get_weather", R"({"city": "Rome"})")));         // not in the enum
  EXPECT_FALSE(accepts(hermes, std::nullopt, call("get_weather", R"({"days": 1})")));              // city is required
  EXPECT_FALSE(accepts(hermes, std::nullopt, call("get_weather", R"({"city": "Oslo", "days": "1"})")));  // a string
  EXPECT_FALSE(accepts(hermes, std::nullopt, call("get_weather", R"({"city": "Oslo", "x": 1})")));  // not allowed
  // No `parameters`: exactly {}.
  EXPECT_TRUE(accepts(hermes, std::nullopt, call("get_time", "{}")));
  EXPECT_FALSE(accepts(hermes, std::nullopt, call("get_time", R"({"tz": "UTC"})")));
}

// A schema that leaves the type open still gives arguments that are an object, so what the
// grammar enforces is always read back as a call.
TEST(ToolCallGrammar, ArgumentsAreAnObjectWhereTheSchemaLeavesTheTypeOpen) {
  const ToolCallFormat hermes{ToolCallSyntax::Hermes};
  const auto call = [](const std::string& args) {
    return "<tool_call>\n{\"name\": \"f\", \"arguments\": " + args + "}\n</tool_call>";
  };
  for (const std::string params :
       {R"({})", R"({"description": "anything"})", R"({"type": null})",
        R"({"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"type": "array"}]})"}) {
    SCOPED_TRACE(params);
    const ordered_json tools =
        ordered_json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": )" + params + "}}]");
    const GrammarMatcher start(Grammar::compile(tool_call_gbnf(hermes, tools, std::string("f"))));
    for (const std::string args : {R"("text")", "10.0", "[1]", "null", "{}"}) {
      GrammarMatcher m = start;
      EXPECT_EQ(m.accept_bytes(call(args)) && m.can_end(), args == "{}") << args;
    }
  }
}

TEST(ToolCallGrammar, SchemasThatCannotBeEnforcedAre400NamingTheFunction) {
  const ordered_json bad = ordered_json::parse(R"([{"type": "function", "function": {"name": "ok"}},
      {"type": "function", "function": {"name": "broken", "parameters": {"type": "nonsense"}}}])");
  try {
    compile_tool_call_grammar({ToolCallSyntax::Hermes}, bad, std::nullopt);
    FAIL() << "expected a 400";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "tools");
    EXPECT_NE(std::string(e.what()).find("broken"), std::string::npos) << e.what();
  }
  EXPECT_NE(compile_tool_call_grammar({ToolCallSyntax::Hermes}, bad, std::string("ok")), nullptr);
  EXPECT_THROW(tool_call_gbnf({ToolCallSyntax::None}, bad, std::nullopt), std::invalid_argument);
  EXPECT_THROW(tool_call_gbnf({ToolCallSyntax::Hermes}, bad, std::string("missing")), std::invalid_argument);
}

}  // namespace
}  // namespace fdl::server
