// Real chat templates (../shared/chat-templates: 71 templates, six conversations each) rendered
// by the interpreter against Hugging Face Transformers' renderings of the same requests.
#include <gtest/gtest.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "jinja/template.h"
#include "test_support.h"

namespace fdl::jinja {
namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The references' clock: 2026-12-02 09:30:00.
std::tm pinned_clock() {
  std::tm t{};
  t.tm_year = 2026 - 1900, t.tm_mon = 11, t.tm_mday = 2, t.tm_hour = 9, t.tm_min = 30;
  std::mktime(&t);  // fills tm_wday and tm_yday
  return t;
}

TEST(ChatTemplateReferences, RenderLikeTransformers) {
  const auto dir = test::shared_dir() / "chat-templates";
  const auto refs = nlohmann::ordered_json::parse(read_file(dir / "references.json"));
  std::map<std::string, std::unique_ptr<Template>> templates;
  std::map<std::string, std::string> parse_errors;
  int rendered = 0, matched = 0, raised = 0, refused = 0;
  std::string report;
  RenderOptions opt;
  opt.clock = pinned_clock;
  for (const auto& c : refs["cases"]) {
    const std::string name = c["template"];
    if (!templates.count(name) && !parse_errors.count(name)) {
      try {
        templates[name] = std::make_unique<Template>(read_file(dir / "templates" / name));
      } catch (const TemplateError& e) {
        parse_errors[name] = e.what();
      }
    }
    Object ctx;
    ctx.set(Value("messages"), Value::from_json(c["messages"]));
    ctx.set(Value("tools"), Value::from_json(c["tools"]));
    ctx.set(Value("documents"), Value::none());
    ctx.set(Value("add_generation_prompt"), Value(c["add_generation_prompt"].get<bool>()));
    ctx.set(Value("bos_token"), Value(c["bos_token"].get<std::string>()));
    ctx.set(Value("eos_token"), Value(c["eos_token"].get<std::string>()));
    std::string got, error;
    if (parse_errors.count(name)) {
      error = parse_errors[name];
    } else {
      try {
        got = templates[name]->render(ctx, opt);
      } catch (const TemplateError& e) {
        error = e.what();
      }
    }
    const std::string label = name + " / " + c["conversation"].get<std::string>();
    if (c.contains("expected")) {
      ++rendered;
      if (error.empty() && got == c["expected"].get<std::string>()) ++matched;
      else report += "  differs: " + label + (error.empty() ? "" : " (" + error + ")") + "\n";
    } else {
      ++raised;
      if (!error.empty()) ++refused;
      else report += "  rendered where Transformers raised: " + label + "\n";
    }
  }
  std::printf("%d of %d renderings byte-identical; %d of %d raising cases refused\n%s", matched, rendered, refused,
              raised, report.c_str());
  EXPECT_EQ(refused, raised);
  EXPECT_EQ(matched, rendered);
}

// Long conversations through every template: a thousand messages of about 1 KiB (tool calls and
// results included where the template takes them) stay within the rendering's work budget, also
// in templates that rescan all messages at each one or build the prompt by concatenation.
TEST(ChatTemplateReferences, LongConversationsStayWithinTheWorkBudget) {
  const auto dir = test::shared_dir() / "chat-templates";
  const auto refs = nlohmann::ordered_json::parse(read_file(dir / "references.json"));
  std::map<std::string, nlohmann::ordered_json> tool_cases, turn_cases;  // cases Transformers rendered
  for (const auto& c : refs["cases"]) {
    if (!c.contains("expected")) continue;
    if (c["conversation"] == "tool_round_trip") tool_cases[c["template"]] = c;
    if (c["conversation"] == "multi_turn") turn_cases[c["template"]] = c;
  }
  const std::string filler(1000, 'w');
  const auto text = [&](const std::string& s) { return nlohmann::ordered_json(s + " " + filler); };
  RenderOptions opt;
  opt.clock = pinned_clock;
  int rendered = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir / "templates")) {
    const std::string name = entry.path().filename().string();
    const bool tools = tool_cases.count(name) != 0;
    if (!tools && !turn_cases.count(name)) continue;
    const auto& c = tools ? tool_cases[name] : turn_cases[name];
    const auto& m = c["messages"];
    auto messages = nlohmann::ordered_json::array();
    if (tools) {  // user, assistant call, tool result, assistant answer; ends on a tool result
      for (int i = 0; i < 250; ++i) {
        auto user = m[0];
        user["content"] = text(m[0]["content"]);
        messages.push_back(user);
        messages.push_back(m[1]);
        messages.push_back(m[2]);
        if (i + 1 < 250) messages.push_back({{"role", "assistant"}, {"content", text("It is 18 degrees.")}});
      }
    } else {  // system, then user and assistant turns, ending on a user turn
      messages.push_back(m[0]);
      for (int i = 0; i < 500; ++i) {
        auto user = m[1], assistant = m[2];
        user["content"] = text(m[1]["content"]);
        assistant["content"] = text(m[2]["content"]);
        messages.push_back(user);
        if (i + 1 < 500) messages.push_back(assistant);
      }
    }
    Object ctx;
    ctx.set(Value("messages"), Value::from_json(messages));
    ctx.set(Value("tools"), Value::from_json(c["tools"]));
    ctx.set(Value("documents"), Value::none());
    ctx.set(Value("add_generation_prompt"), Value(true));
    ctx.set(Value("bos_token"), Value(c["bos_token"].get<std::string>()));
    ctx.set(Value("eos_token"), Value(c["eos_token"].get<std::string>()));
    try {
      const std::string out = Template(read_file(entry.path())).render(ctx, opt);
      EXPECT_GT(out.size(), size_t(500) * filler.size()) << name;
      ++rendered;
    } catch (const TemplateError& e) {
      // A template may refuse the conversation's shape; never for the work it takes.
      EXPECT_EQ(std::string(e.what()).find("too much work"), std::string::npos) << name << ": " << e.what();
    }
  }
  std::printf("%d templates rendered a 1,000-message conversation\n", rendered);
  EXPECT_GE(rendered, 60);
}

}  // namespace
}  // namespace fdl::jinja
