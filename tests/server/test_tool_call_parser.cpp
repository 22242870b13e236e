// Tool calls read out of replies, per syntax: whole, split at every byte, fed a byte at a
// time; markers held back and never content; malformed calls given back as content.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/json_scanner.h"
#include "server/tool_call_parser.h"

namespace fdl::server {
namespace {

using Kind = ToolCallEvent::Kind;

const ToolCallFormat kHermes{ToolCallSyntax::Hermes};
const ToolCallFormat kLlama{ToolCallSyntax::Llama3Json};
const ToolCallFormat kMistralArray{ToolCallSyntax::MistralJsonArray, true};
const ToolCallFormat kMistralArgs{ToolCallSyntax::MistralNameArgs, true, true};
const std::vector<std::string> kNames = {"get_weather", "get_time"};

// Ids call_0, call_1, ... so that results compare.
std::function<std::string()> counting_ids() {
  return [n = 0]() mutable { return "call_" + std::to_string(n++); };
}

ParsedReply parse(ToolCallFormat f, std::string_view text) { return parse_tool_calls(f, text, kNames, counting_ids()); }

// The reply collected from `text` fed in the pieces that `cuts` (ascending offsets) make.
ParsedReply parse_in_pieces(ToolCallFormat f, std::string_view text, const std::vector<size_t>& cuts,
                            std::vector<ToolCallEvent>* all = nullptr) {
  ToolCallParser parser(f, kNames, counting_ids());
  ParsedReply reply;
  size_t from = 0;
  auto take = [&](std::vector<ToolCallEvent> events) {
    if (all != nullptr) all->insert(all->end(), events.begin(), events.end());
    collect_tool_call_events(reply, events);
  };
  for (const size_t cut : cuts) {
    take(parser.feed(text.substr(from, cut - from)));
    from = cut;
  }
  take(parser.feed(text.substr(from)));
  take(parser.finish());
  return reply;
}

void expect_same(const ParsedReply& a, const ParsedReply& b, const std::string& where) {
  EXPECT_EQ(a.content, b.content) << where;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << where;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].id, b.calls[i].id) << where;
    EXPECT_EQ(a.calls[i].name, b.calls[i].name) << where;
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments) << where;
  }
}

// Every split in two, and one byte at a time, collect to the whole reply's result: no piece
// of a marker went out as content early, and no split loses or repeats text.
void expect_split_invariant(ToolCallFormat f, const std::string& text) {
  const ParsedReply whole = parse(f, text);
  for (size_t k = 0; k <= text.size(); ++k) expect_same(parse_in_pieces(f, text, {k}), whole, "cut at " + std::to_string(k));
  std::vector<size_t> every;
  for (size_t k = 1; k < text.size(); ++k) every.push_back(k);
  expect_same(parse_in_pieces(f, text, every), whole, "byte by byte");
}

TEST(JsonScanner, AcceptsValuesAndRefusesBrokenOnes) {
  auto run = [](std::string_view text) {
    JsonScanner s;
    for (size_t i = 0; i < text.size(); ++i) {
      const JsonScanner::Step step = s.feed(text[i]);
      if (step == JsonScanner::Step::Error) return std::string("error@") + std::to_string(i);
      if (step == JsonScanner::Step::Done) return std::string("done@") + std::to_string(i);
      if (step == JsonScanner::Step::DoneBefore) return std::string("before@") + std::to_string(i);
    }
    return std::string(s.complete_at_end() ? "complete" : "more");
  };
  EXPECT_EQ(run(R"( {"a": [1, -2.5e+3, true, null, "x\"\u00e9"], "b": {}}x)"), "done@53");
  EXPECT_EQ(run("[]"), "done@1");
  EXPECT_EQ(run("\"\\n\""), "done@3");
  EXPECT_EQ(run("12 "), "before@2");
  EXPECT_EQ(run("12"), "complete");
  EXPECT_EQ(run("{\"a\": 1"), "more");
  EXPECT_EQ(run("{\"a\" 1}"), "error@5");
  EXPECT_EQ(run("{\"a\": 01}"), "error@7");
  EXPECT_EQ(run("{\"a\": tru }"), "error@9");
  EXPECT_EQ(run("[1,]"), "error@3");
  EXPECT_EQ(run("{,}"), "error@1");
  EXPECT_EQ(run("\"\\x\""), "error@2");
  EXPECT_EQ(run("\"\\u12G4\""), "error@5");
  EXPECT_EQ(run("\"a\nb\""), "error@2");  // a raw control byte inside a string
  EXPECT_EQ(run("[1}"), "error@2");
}

TEST(ToolCallParser, HermesCallsAndContent) {
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"arguments\": {}, \"name\": \"get_time\"}\n</tool_call>";
  const ParsedReply r = parse(kHermes, text);
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].id, "call_0");
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(r.calls[1].name, "get_time");  // arguments before the name: sent once the name is known
  EXPECT_EQ(r.calls[1].arguments, "{}");
  expect_split_invariant(kHermes, text);
  expect_split_invariant(kHermes, text + "\n\nDone <b>here</b>.");
}

TEST(ToolCallParser, PlainRepliesAreContentUnchanged) {
  for (const std::string text : {"Hello, world!", "  spaced  \n", "a <b> [x] {\"name\": 1} <tool", "", "\xC3\xA9t\xC3\xA9"}) {
    for (const ToolCallFormat f : {kHermes, kMistralArray, kMistralArgs}) {
      const ParsedReply r = parse(f, text);
      EXPECT_EQ(r.content, text);
      EXPECT_TRUE(r.calls.empty());
      expect_split_invariant(f, text);
    }
  }
  EXPECT_EQ(parse(kLlama, "The answer is 4.\n").content, "The answer is 4.\n");
}

TEST(ToolCallParser, MarkersAreHeldBackNotSentAsContent) {
  ToolCallParser p(kHermes, kNames, counting_ids());
  std::vector<ToolCallEvent> e = p.feed("Sure. <tool");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0], (ToolCallEvent{Kind::Content, 0, "Sure.", "", ""}));
  e = p.feed("_call>\n{\"name\": \"get_weather\", \"argu");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].kind, Kind::CallBegin);
  EXPECT_EQ(e[0].name, "get_weather");
  EXPECT_EQ(e[0].id, "call_0");
  e = p.feed("ments\": {\"city\": \"Pa");
  ASSERT_EQ(e.size(), 1u);  // arguments stream before the call is complete
  EXPECT_EQ(e[0], (ToolCallEvent{Kind::CallArguments, 0, "{\"city\": \"Pa", "", ""}));
  e = p.feed("ris\"}}\n</tool_");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0], (ToolCallEvent{Kind::CallArguments, 0, "ris\"}", "", ""}));
  EXPECT_TRUE(p.feed("call>").empty());
  EXPECT_TRUE(p.finish().empty());

  // A held tail that turns out not to be a marker is content, at once or at the end.
  ToolCallParser q(kMistralArgs, kNames, counting_ids());
  EXPECT_EQ(q.feed("Use [TOOL_").at(0).text, "Use");
  EXPECT_EQ(q.feed("S] now").at(0).text, " [TOOL_S] now");
  EXPECT_TRUE(q.feed(" [TOOL").empty());
  EXPECT_EQ(q.finish().at(0).text, " [TOOL");
}

TEST(ToolCallParser, MalformedCallsComeBackAsContent) {
  // Broken after the name was announced: CallFailed carries the text; nothing is lost.
  const std::string broken = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }}\n</tool_call>";
  std::vector<ToolCallEvent> events;
  const ParsedReply r = parse_in_pieces(kHermes, broken, {}, &events);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, broken);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events[0].kind, Kind::CallBegin);
  EXPECT_EQ(events[2].kind, Kind::CallFailed);
  expect_split_invariant(kHermes, broken);

  for (const std::string text : {
           "<tool_call>\nnot json\n</tool_call>",                                   // not an object
           "<tool_call>\n{\"arguments\": {}}\n</tool_call>",                         // no name
           "<tool_call>\n{\"name\": 5, \"arguments\": {}}</tool_call>",              // name not a string
           "<tool_call>\n{\"name\": \"get_time\", \"arguments\": [1]}</tool_call>",  // arguments not an object
           "<tool_call>\n{\"name\": \"a\", \"name\": \"b\"}</tool_call>",            // a member twice
           "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa",  // the reply ends inside
           "<tool_call>"}) {
    const ParsedReply m = parse(kHermes, "Hi\n" + text);
    EXPECT_TRUE(m.calls.empty()) << text;
    EXPECT_EQ(m.content, "Hi" + text) << text;  // the whitespace before a marker is not content
    expect_split_invariant(kHermes, "Hi\n" + text);
  }
  // A valid call after a broken one still counts; ids and indexes keep counting.
  const ParsedReply mixed = parse(kHermes,
                                  "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {x}}</tool_call>"
                                  "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}</tool_call>");
  ASSERT_EQ(mixed.calls.size(), 1u);
  EXPECT_EQ(mixed.calls[0].id, "call_1");
  EXPECT_EQ(mixed.content, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {x}}</tool_call>");
}

// parallel_tool_calls false: the first call that stands is kept, and the reply ends where the
// next call begins, in collected replies and in streams cut anywhere alike.
TEST(ToolCallParser, MaxCallsKeepsTheFirstCallThatStands) {
  const std::string weather = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const std::string time = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  const std::string broken = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {x}}</tool_call>";
  auto parse_one = [](const std::string& text) { return parse_tool_calls(kHermes, text, kNames, counting_ids(), 1); };
  const ParsedReply two = parse_one("Checking.\n" + weather + "\n" + time + "\nDone.");
  ASSERT_EQ(two.calls.size(), 1u);
  EXPECT_EQ(two.calls[0].name, "get_weather");
  EXPECT_EQ(two.calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(two.content, "Checking.");
  // A broken first call is content, and the next good call is the one kept.
  const ParsedReply after_broken = parse_one(broken + weather + time);
  ASSERT_EQ(after_broken.calls.size(), 1u);
  EXPECT_EQ(after_broken.calls[0].name, "get_weather");
  EXPECT_EQ(after_broken.content, broken);
  // A broken call after the kept one is dropped too, not given back as content.
  const ParsedReply then_broken = parse_one(weather + broken);
  ASSERT_EQ(then_broken.calls.size(), 1u);
  EXPECT_EQ(then_broken.content, "");
  // Streams see the same: no event of a dropped call, wherever the text is cut.
  const std::string text = weather + "\n" + time;
  std::vector<size_t> every;
  for (size_t k = 1; k < text.size(); ++k) every.push_back(k);
  ToolCallParser parser(kHermes, kNames, counting_ids(), 1);
  std::vector<ToolCallEvent> events;
  for (size_t from = 0, i = 0; i <= every.size(); ++i) {
    const size_t to = i < every.size() ? every[i] : text.size();
    for (ToolCallEvent& e : parser.feed(std::string_view(text).substr(from, to - from))) events.push_back(std::move(e));
    from = to;
  }
  for (ToolCallEvent& e : parser.finish()) events.push_back(std::move(e));
  for (const ToolCallEvent& e : events) EXPECT_EQ(e.index, 0u) << e.text;
  // Without a limit both calls stand.
  EXPECT_EQ(parse(kHermes, text).calls.size(), 2u);
}

TEST(ToolCallParser, HermesClosingMarkerIsOptional) {
  const ParsedReply r = parse(kHermes, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\nThen text.");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "Then text.");
  const ParsedReply end = parse(kHermes, "<tool_call>{\"name\": \"get_time\"}</tool_");
  ASSERT_EQ(end.calls.size(), 1u);
  EXPECT_EQ(end.calls[0].arguments, "{}");
  EXPECT_EQ(end.content, "");
}

TEST(ToolCallParser, Llama3WholeReplyCalls) {
  const std::string one = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": [1, 2]}}";
  ParsedReply r = parse(kLlama, one);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Paris", "days": [1, 2]})");
  EXPECT_EQ(r.content, "");
  expect_split_invariant(kLlama, one);

  const std::string tagged = "\n<|python_tag|>{\"name\": \"get_time\", \"arguments\": {}}; {\"name\": \"get_weather\", "
                             "\"parameters\": {\"city\": \"Oslo\"}}";
  r = parse(kLlama, tagged);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_time");
  EXPECT_EQ(r.calls[1].arguments, R"({"city": "Oslo"})");
  EXPECT_EQ(r.content, "");
  expect_split_invariant(kLlama, tagged);

  // JSON that names no function of the request, and text that merely starts like the tag,
  // are answers, not calls.
  for (const std::string text : {"{\"name\": \"Bob\", \"age\": 3}", "{\"answer\": 42}", "<|python_ta", "<b>bold</b>",
                                 "{\"name\": \"get_time\", \"parameters\": {\"x\": }}", "  {\"name\": \"get_time\""}) {
    r = parse(kLlama, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text) << text;
    expect_split_invariant(kLlama, text);
  }
  // Text after a call is content; a bare <|python_tag|> is not.
  r = parse(kLlama, "{\"name\": \"get_time\", \"parameters\": {}}\n\nDone.");
  EXPECT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "Done.");
  EXPECT_EQ(parse(kLlama, "<|python_tag|>print(1)").content, "print(1)");
  EXPECT_EQ(parse(kLlama, "<|python_tag|>").content, "");
}

TEST(ToolCallParser, MistralJsonArray) {
  const std::string text =
      "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abcDEF123\"}, "
      "{\"name\": \"get_time\", \"arguments\": {}}]";
  const ParsedReply r = parse(kMistralArray, text);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(r.calls[1].name, "get_time");
  EXPECT_EQ(r.content, "");
  expect_split_invariant(kMistralArray, text);
  expect_split_invariant(kMistralArray, "I will call.[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {}}] ok");
  // A broken second call: the first stands, the second's text is content.
  const ParsedReply broken =
      parse(kMistralArray, "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {}}, {\"name\": \"get_weather\", \"argu");
  ASSERT_EQ(broken.calls.size(), 1u);
  EXPECT_EQ(broken.content, ", {\"name\": \"get_weather\", \"argu");
  EXPECT_EQ(parse(kMistralArray, "[TOOL_CALLS]oops").content, "[TOOL_CALLS]oops");
}

TEST(ToolCallParser, MistralNameArgs) {
  const std::string text =
      "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[CALL_ID]abcDEF123[ARGS]{}";
  const ParsedReply r = parse(kMistralArgs, text);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(r.calls[1].name, "get_time");
  EXPECT_EQ(r.calls[1].arguments, "{}");
  EXPECT_EQ(r.content, "");
  expect_split_invariant(kMistralArgs, text);
  for (const std::string bad : {"[TOOL_CALLS]get weather[ARGS]{}", "[TOOL_CALLS][ARGS]{}", "[TOOL_CALLS]f[ARGZ]{}",
                                "[TOOL_CALLS]f[ARGS]x", "[TOOL_CALLS]f[ARGS]{\"a\": 1"}) {
    const ParsedReply m = parse(kMistralArgs, bad);
    EXPECT_TRUE(m.calls.empty()) << bad;
    EXPECT_EQ(m.content, bad) << bad;
    expect_split_invariant(kMistralArgs, bad);
  }
}

TEST(ToolCallParser, UnicodeArgumentsAreKeptAsWritten) {
  const std::string text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Z\xC3\xBCrich \\u00e9\"}}\n</tool_call>";
  const ParsedReply r = parse(kHermes, text);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"city\": \"Z\xC3\xBCrich \\u00e9\"}");
  EXPECT_EQ(nlohmann::json::parse(r.calls[0].arguments)["city"], "Z\xC3\xBCrich \xC3\xA9");
  expect_split_invariant(kHermes, text);
}

// Long runs of whitespace are held (they may lead to a marker) but must cost O(1) per byte:
// a reply of 200k spaces, fed a byte at a time as a stream delivers it, parses in milliseconds.
TEST(ToolCallParser, LongWhitespaceRunsStayLinear) {
  const std::string spaces(200000, ' ');
  std::string mixed;
  for (size_t i = 0; i < 100000; ++i) mixed += i % 2 == 0 ? " " : "\n";
  const std::string call = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}";
  struct Case {
    ToolCallFormat format;
    std::string text, content;
    size_t calls;
  };
  const std::vector<Case> cases = {
      {kHermes, spaces, spaces, 0},
      {kHermes, "Hi" + spaces + "there", "Hi" + spaces + "there", 0},
      {kHermes, "Hi" + spaces + "<tool", "Hi" + spaces + "<tool", 0},
      {kHermes, call + spaces, "", 1},
      {kHermes, call + mixed + "</tool_call>" + mixed + "Done.", "Done.", 1},
      {kHermes, call + mixed + "</tool_x", "</tool_x", 1},
      {kMistralArgs, "Hi" + mixed + "[TOOL_CALLS]get_time[ARGS]{}" + spaces, "Hi", 1},
      {kMistralArray, "[TOOL_CALLS][{\"name\": \"get_time\"}" + spaces + "]" + mixed + "ok", "ok", 1},
      {kLlama, spaces + "{\"name\": \"get_time\", \"parameters\": {}}" + mixed + "ok", "ok", 1},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    ToolCallParser parser(c.format, kNames, counting_ids());
    ParsedReply reply;
    const auto start = std::chrono::steady_clock::now();
    for (const char byte : c.text) collect_tool_call_events(reply, parser.feed(std::string_view(&byte, 1)));
    collect_tool_call_events(reply, parser.finish());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 2.0) << "case " << i;
    EXPECT_EQ(reply.content, c.content) << "case " << i;
    EXPECT_EQ(reply.calls.size(), c.calls) << "case " << i;
  }
  // Whitespace runs around partial markers, split every way: what is held and released
  // is the same as before the counting.
  const std::string around = "a  \n <to  <tool_ x \n\n<tool_call>{\"name\": \"get_time\"}  \n </tool_call>  b  <t";
  EXPECT_EQ(parse(kHermes, around).content, "a  \n <to  <tool_ xb  <t");
  expect_split_invariant(kHermes, around);
}

TEST(ToolCallIds, AsTheTemplateRequires) {
  const std::string nine = new_tool_call_id(ToolCallFormat{ToolCallSyntax::MistralJsonArray, true});
  EXPECT_EQ(nine.size(), 9u);
  for (const char c : nine) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << nine;
  const std::string long_id = new_tool_call_id(kHermes);
  EXPECT_EQ(long_id.rfind("call_", 0), 0u);
  EXPECT_EQ(long_id.size(), 29u);
  EXPECT_NE(long_id, new_tool_call_id(kHermes));
}

}  // namespace
}  // namespace fdl::server
