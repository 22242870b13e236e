// The linear ordered-JSON parser: the value nlohmann's parse gives, in time linear in the text.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include <nlohmann/json.hpp>

#include "core/json_error_text.h"
#include "server/ordered_json_parser.h"
#include "test_support.h"

namespace fdl::server {
namespace {

using nlohmann::ordered_json;

TEST(OrderedJsonParser, GivesNlohmannsValue) {
  for (const std::string text :
       {R"({"z": 1, "a": [true, null, -2, 18446744073709551615, 1.5e3, "s\u00e9"], "m": {"y": {}, "b": []}})",
        R"([{"k": 1}, {"k": 2, "j": {"deep": [[[]]]}}])", R"("just a string")", "42", "null",
        R"({"dup": 1, "other": 2, "dup": {"x": 3}})",  // a repeated key: first position, last value
        R"({"": 0, "a\"b": 1})"}) {
    const ordered_json ours = parse_ordered_json(text), theirs = ordered_json::parse(text);
    EXPECT_EQ(ours, theirs) << text;
    EXPECT_EQ(ours.dump(), theirs.dump()) << text;  // the same key order
  }
  EXPECT_EQ(parse_ordered_json(R"({"dup": 1, "other": 2, "dup": 3})").dump(), R"({"dup":3,"other":2})");
}

TEST(OrderedJsonParser, InvalidTextIsDiscarded) {
  for (const std::string text : {"", "{", R"({"a": })", "[1,]", "1e999", R"({"a": 1} x)", "nul"})
    EXPECT_TRUE(parse_ordered_json(text).is_discarded()) << text;
}

// The error names what nlohmann's parse would: the position and what was expected there.
// nlohmann's message, without its exception id.
TEST(OrderedJsonParser, InvalidTextGivesNlohmannsMessage) {
  for (const std::string text : {"{", R"({"a": })", "[1,]", R"({"a": 1} x)"}) {
    std::string error, theirs;
    EXPECT_TRUE(parse_ordered_json(text, &error).is_discarded());
    try {
      theirs = "parsed: " + ordered_json::parse(text).dump();
    } catch (const nlohmann::json::parse_error& e) {
      theirs = json_error_text(e);
    }
    EXPECT_FALSE(error.empty()) << text;
    EXPECT_EQ(error.find("[json.exception"), std::string::npos) << error;
    EXPECT_EQ(error, theirs) << text;
  }
  std::string untouched = "kept";
  EXPECT_FALSE(parse_ordered_json("[1]", &untouched).is_discarded());
  EXPECT_EQ(untouched, "kept");
}

// nlohmann's parse of this object takes seconds (each key searched among those before it).
TEST(OrderedJsonParser, ManyKeysTakeLinearTime) {
  std::string text = "{";
  for (int i = 0; i < 200000; ++i) text += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":" + std::to_string(i);
  text += "}";
  const auto start = std::chrono::steady_clock::now();
  const ordered_json j = parse_ordered_json(text);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(j.size(), 200000u);
  EXPECT_EQ(j.begin().key(), "k0");
  EXPECT_EQ(j.back(), 199999);
  EXPECT_LT(s, 1.0 * test::kSlowBuild);
}

}  // namespace
}  // namespace fdl::server
