// One tool call's JSON object, read a byte at a time (tool_call_object.h).
#include "server/tool_call_object.h"

#include <nlohmann/json.hpp>

namespace fdl::server {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The string a complete JSON string literal holds, or nullopt (invalid UTF-8).
std::optional<std::string> decode_string(const std::string& literal) {
  const nlohmann::json v = nlohmann::json::parse(literal, nullptr, false);
  if (!v.is_string()) return std::nullopt;
  return v.get<std::string>();
}

}  // namespace

ToolCallObjectReader::Step ToolCallObjectReader::value_ended() {
  if (member_ == Member::Name) {
    name_ = decode_string(text_);
    if (!name_) return fail();
  }
  state_ = State::AfterMember;
  return Step::More;
}

ToolCallObjectReader::Step ToolCallObjectReader::close() {
  if (!name_) return fail();
  if (!has_arguments_) arguments_ = "{}";
  state_ = State::Done;
  return Step::Done;
}

ToolCallObjectReader::Step ToolCallObjectReader::feed(char c) {
  switch (state_) {
    case State::Open:
      if (is_ws(c)) return Step::More;
      if (c != '{') return fail();
      state_ = State::FirstKey;
      return Step::More;
    case State::FirstKey:
    case State::Key:
      if (is_ws(c)) return Step::More;
      if (c == '}' && state_ == State::FirstKey) return close();
      if (c != '"') return fail();
      scanner_ = JsonScanner{};
      scanner_.feed(c);
      text_ = c;
      state_ = State::KeyText;
      return Step::More;
    case State::KeyText: {
      text_ += c;
      const JsonScanner::Step s = scanner_.feed(c);
      if (s == JsonScanner::Step::Error) return fail();
      if (s != JsonScanner::Step::Done) return Step::More;
      const std::optional<std::string> key = decode_string(text_);
      if (!key) return fail();
      member_ = *key == "name"                              ? Member::Name
                : *key == "arguments" || *key == "parameters" ? Member::Arguments
                                                             : Member::Other;
      if ((member_ == Member::Name && name_) || (member_ == Member::Arguments && has_arguments_)) return fail();
      state_ = State::Colon;
      return Step::More;
    }
    case State::Colon:
      if (is_ws(c)) return Step::More;
      if (c != ':') return fail();
      scanner_ = JsonScanner{};
      text_.clear();
      state_ = State::Value;
      return Step::More;
    case State::Value: {
      const bool first = !scanner_.started();
      const JsonScanner::Step s = scanner_.feed(c);
      if (s == JsonScanner::Step::Error) return fail();
      if (!scanner_.started()) return Step::More;  // whitespace before the value
      if (s == JsonScanner::Step::DoneBefore) {     // a number ended at c: c follows the member
        state_ = State::AfterMember;
        return feed(c);
      }
      if (member_ == Member::Name) {
        if (first && c != '"') return fail();
        text_ += c;
      } else if (member_ == Member::Arguments) {
        if (first && c != '{') return fail();
        has_arguments_ = true;
        arguments_ += c;
      }
      return s == JsonScanner::Step::Done ? value_ended() : Step::More;
    }
    case State::AfterMember:
      if (is_ws(c)) return Step::More;
      if (c == ',') {
        state_ = State::Key;
        return Step::More;
      }
      if (c == '}') return close();
      return fail();
    case State::Done:
    case State::Failed:
      return fail();
  }
  return fail();
}

}  // namespace fdl::server
