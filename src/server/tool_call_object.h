// tool_call_object.h — internal: reads one tool call written as a JSON object,
// {"name": "NAME", "arguments": {...}} (Hermes, Mistral's JSON array) or
// {"name": "NAME", "parameters": {...}} (Llama 3), a byte at a time, so the name is known as
// soon as its string closes and the arguments can be passed on while they are written.
//
// Members: "name" (a string), "arguments" or "parameters" (an object; its text is kept as
// written, whitespace included), anything else (Mistral's "id", a "type") checked for syntax
// and skipped, in any order. A call without arguments gets "{}". Errors (feed answers Error at
// the byte that shows it): broken JSON, a name that is not a string, arguments that are not an
// object, a member given twice, no name by the closing brace.
// Thread-safety: one reader is one call's state; not thread-safe.
#pragma once

#include <optional>
#include <string>

#include "server/json_scanner.h"

namespace fdl::server {

class ToolCallObjectReader {
 public:
  enum class Step { More, Done, Error };

  /// Feeds the next byte; whitespace before the opening brace is skipped. After Done or
  /// Error, every byte answers Error.
  Step feed(char c);
  /// The function's name, once its string is complete.
  const std::optional<std::string>& name() const { return name_; }
  /// The arguments' JSON text read so far (complete once feed answered Done).
  const std::string& arguments() const { return arguments_; }

 private:
  enum class State { Open, FirstKey, Key, KeyText, Colon, Value, AfterMember, Done, Failed };
  enum class Member { Name, Arguments, Other };

  Step fail() {
    state_ = State::Failed;
    return Step::Error;
  }
  Step value_ended();  // the current member's value is complete
  Step close();        // the closing brace

  State state_ = State::Open;
  Member member_ = Member::Other;
  JsonScanner scanner_;      // the key or value being read
  std::string text_;         // its text (keys and names, to decode)
  std::optional<std::string> name_;
  std::string arguments_;
  bool has_arguments_ = false;
};

}  // namespace fdl::server
