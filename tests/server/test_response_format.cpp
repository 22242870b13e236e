// response_format, grammar and json_schema → the output grammar (server/response_format.h).
#include <gtest/gtest.h>

#include "server/openai_error.h"
#include "server/response_format.h"

namespace fdl::server {
namespace {

using nlohmann::json;

std::string param_of(const json& body) {
  grammar::GrammarCache cache;
  try {
    parse_output_grammar(body, nullptr, cache);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    return e.param() + ": " + e.what();
  }
  return "";
}

bool accepts(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.accept_bytes(text) && m.can_end();
}

TEST(ResponseFormat, NoneOrTextMeansNoGrammar) {
  grammar::GrammarCache cache;
  EXPECT_EQ(parse_output_grammar(json::object(), nullptr, cache), nullptr);
  EXPECT_EQ(parse_output_grammar({{"response_format", {{"type", "text"}}}}, nullptr, cache), nullptr);
  EXPECT_EQ(parse_output_grammar({{"grammar", nullptr}}, nullptr, cache), nullptr);
}

TEST(ResponseFormat, JsonObjectSchemaAndGbnf) {
  grammar::GrammarCache cache;
  const auto obj = parse_output_grammar({{"response_format", {{"type", "json_object"}}}}, nullptr, cache);
  ASSERT_NE(obj, nullptr);
  EXPECT_TRUE(accepts(obj, R"({"a": [1, "x", null]})"));
  EXPECT_FALSE(accepts(obj, "[1]"));
  const json schema = {{"type", "object"},
                       {"properties", {{"n", {{"type", "integer"}, {"minimum", 0}, {"maximum", 9}}}}},
                       {"required", {"n"}}};
  const auto js = parse_output_grammar(
      {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}}}}, nullptr,
      cache);
  EXPECT_TRUE(accepts(js, R"({"n": 7})"));
  EXPECT_FALSE(accepts(js, R"({"n": 10})"));
  const auto g = parse_output_grammar({{"grammar", "root ::= \"yes\" | \"no\""}}, nullptr, cache);
  EXPECT_TRUE(accepts(g, "no"));
  // Equal constraints share one compiled grammar.
  EXPECT_EQ(parse_output_grammar({{"grammar", "root ::= \"yes\" | \"no\""}}, nullptr, cache), g);
  EXPECT_NE(parse_output_grammar({{"json_schema", schema}}, nullptr, cache), nullptr);
}

TEST(ResponseFormat, SchemaPropertiesKeepTheClientsOrder) {
  grammar::GrammarCache cache;
  const std::string text =
      R"({"json_schema": {"type": "object", "properties": {"z": {"const": 1}, "a": {"const": 2}}, "required": ["z", "a"]}})";
  const json body = json::parse(text);
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(text);
  EXPECT_TRUE(accepts(parse_output_grammar(body, &ordered, cache), R"({"z": 1, "a": 2})"));
  EXPECT_TRUE(accepts(parse_output_grammar(body, nullptr, cache), R"({"a": 2, "z": 1})"));
}

TEST(ResponseFormat, BadInputNamesTheFieldAndPosition) {
  EXPECT_NE(param_of({{"response_format", {{"type", "yaml"}}}}).find("response_format:"), std::string::npos);
  EXPECT_NE(param_of({{"response_format", {{"type", 1}}}}).find("response_format:"), std::string::npos);
  EXPECT_NE(param_of({{"response_format", json::object()}}).find("response_format:"), std::string::npos);
  EXPECT_NE(param_of({{"response_format", "json"}}).find("response_format:"), std::string::npos);
  EXPECT_NE(param_of({{"response_format", {{"type", "json_schema"}}}}).find("response_format.json_schema:"),
            std::string::npos);
  const std::string bad_schema = param_of(
      {{"response_format",
        {{"type", "json_schema"},
         {"json_schema",
          {{"schema", {{"type", "object"}, {"properties", {{"n", {{"type", "bogus"}}}}}, {"required", {"n"}}}}}}}}});
  EXPECT_NE(bad_schema.find("response_format.json_schema.schema:"), std::string::npos) << bad_schema;
  EXPECT_NE(bad_schema.find("/properties/n"), std::string::npos) << bad_schema;
  const std::string bad_gbnf = param_of({{"grammar", "root ::= \"a\" (\"b\""}});
  EXPECT_NE(bad_gbnf.find("grammar:"), std::string::npos) << bad_gbnf;
  EXPECT_NE(bad_gbnf.find("line 1, column"), std::string::npos) << bad_gbnf;
  EXPECT_NE(param_of({{"grammar", 3}}).find("grammar:"), std::string::npos);
  EXPECT_NE(param_of({{"grammar", "root ::= \"a\""}, {"json_schema", json::object()}}), "");
  EXPECT_NE(param_of({{"json_schema", "x"}}).find("json_schema:"), std::string::npos);
}

}  // namespace
}  // namespace fdl::server

#include "server/json_fields.h"

namespace fdl::server {
namespace {

TEST(JsonNesting, DeepTextIsRefusedShallowTextAndStringsPass) {
  const std::string ok = std::string(kMaxJsonNesting, '[') + std::string(kMaxJsonNesting, ']');
  EXPECT_NO_THROW(check_json_nesting(ok, "p", "x"));
  const std::string deep = std::string(kMaxJsonNesting + 1, '{');
  EXPECT_THROW(check_json_nesting(deep, "p", "x"), ApiError);
  // Brackets inside strings (escaped quotes included) do not count.
  EXPECT_NO_THROW(check_json_nesting("[\"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\"]", "p", "x"));
}

}  // namespace
}  // namespace fdl::server
