// tool_call_parser.h — internal: splits a model's reply, as its text arrives, into content
// and tool calls in the syntax of its chat template (tool_call_format.h).
//
// feed(chunk) returns what the chunk settles: content text, "call i begins" (with a fresh id
// and the function's name) and fragments of call i's arguments (the JSON text of the
// arguments object as the model writes it; a call's fragments concatenate to it). finish()
// settles the rest at the end of the reply. A whole reply is feed(all) + finish()
// (parse_tool_calls). Splitting the text differently changes only how the events are cut:
// concatenated, they are the same.
//
// What is held back: text that may be the start of a marker ("<tool", "[TOOL_"), and
// whitespace that may precede one (whitespace next to a call is not content); it is released
// as content as soon as the text shows it is not a marker, or at finish(). Marker text is never
// content, with one exception, so that nothing the model wrote is lost: a call that turns out
// malformed (broken JSON, no name, arguments that are not an object, text ending inside it) is
// given back as content, markers included. If the call had already begun (its name was read
// and announced), that comes as a CallFailed event carrying the text: collected replies drop
// the call, streams send the text as content after the call's fragments. A call's closing
// marker (</tool_call>, the ']' of Mistral's array) is optional: a complete call object stands
// without it.
//
// `max_calls` (OpenAI's parallel_tool_calls false: 1) keeps the first calls that stand: once that
// many have begun and not failed, the reply ends where the next call begins (that call and all
// text after it are dropped).
//
// Llama 3's syntax has no opening marker: a reply is read as a call only when it starts
// (after whitespace and <|python_tag|>) with '{' and names a function of the request's tools,
// so a JSON answer is not taken for a call.
// Thread-safety: one parser is one reply's state; not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/json_scanner.h"
#include "server/tool_call_format.h"
#include "server/tool_call_object.h"

namespace fdl::server {

struct ToolCallEvent {
  enum class Kind {
    Content,        ///< `text`: reply text outside calls
    CallBegin,      ///< call `index` begins: `id`, `name`
    CallArguments,  ///< `text`: the next fragment of call `index`'s arguments JSON
    CallFailed,     ///< call `index` was malformed: drop it; `text` (its text) is content
  };
  Kind kind = Kind::Content;
  size_t index = 0;  ///< the call's position among the calls begun in this reply (0, 1, ...)
  std::string text;
  std::string id, name;

  bool operator==(const ToolCallEvent&) const = default;
};

class ToolCallParser {
 public:
  /// `tool_names`: the request's functions (Llama 3 takes a reply for a call only when it
  /// names one of them; the other syntaxes have markers and do not look). `make_id`: the id of
  /// each call begun; default new_tool_call_id(format). `max_calls`: how many calls to keep.
  explicit ToolCallParser(ToolCallFormat format, std::vector<std::string> tool_names = {},
                          std::function<std::string()> make_id = {}, size_t max_calls = SIZE_MAX);

  /// The events `text` settles (consecutive content, and fragments of one call, are merged).
  std::vector<ToolCallEvent> feed(std::string_view text);
  /// The events the end of the reply settles; feed and finish must not be called afterwards.
  std::vector<ToolCallEvent> finish();

 private:
  enum class State {
    Content,      // outside calls, looking for an opening marker
    LlamaStart,   // Llama 3: the reply's first bytes (whitespace, <|python_tag|>, '{')
    CallObject,   // inside a call's JSON object
    HermesClose,  // after a Hermes call object: whitespace and an optional </tool_call>
    LlamaNext,    // after a Llama 3 call: ';' and another call, or the end
    ArrayOpen,    // after Mistral's [TOOL_CALLS]: the '['
    ArrayNext,    // after a call in Mistral's array: ',' and another call, or ']'
    MistralName,  // after [TOOL_CALLS]: NAME up to [ARGS] or [CALL_ID]
    MistralId,    // after [CALL_ID]: the id up to [ARGS]
    MistralArgs,  // after [ARGS]: the arguments object
  };

  void step(char c);
  void step_content(char c);
  void step_llama_start(char c);
  void step_call_object(char c);
  void step_after_call(char c);
  void step_mistral_name(char c);
  void step_mistral_args(char c);

  void begin_call(std::string raw, State state);
  void announce(const std::string& name);
  void send_arguments(const std::string& arguments);
  void call_complete(State next);
  void call_failed(std::string replay);
  void to_content(std::string replay, bool skip_whitespace);
  void release_content(bool at_end);

  void emit_content(std::string_view text);
  void emit_arguments(std::string_view text);
  std::vector<ToolCallEvent> take_events();  // events_, less those of dropped calls

  ToolCallFormat format_;
  std::vector<std::string> tool_names_;
  std::function<std::string()> make_id_;
  std::vector<std::string_view> markers_;  // opening markers looked for in content

  State state_;
  std::string input_;       // the bytes being stepped through (replayed bytes are inserted)
  size_t pos_ = 0;
  std::string held_;        // bytes not settled yet in the current state
  size_t held_ws_ = 0;      // held_ starts with this many whitespace bytes (counted as they
                            // arrive, so whitespace runs are never rescanned)
  bool skip_whitespace_ = false;  // after a call: whitespace before further content is dropped
  size_t tag_read_ = 0;           // Llama 3: bytes of <|python_tag|> read at the start

  // The call being read.
  std::string raw_;         // its text from its marker on (given back if it is malformed)
  size_t begun_ = 0;        // calls announced so far in this reply
  size_t current_ = 0;      // the current call's index, once announced
  bool announced_ = false;
  size_t arguments_sent_ = 0;
  ToolCallObjectReader object_;
  JsonScanner arguments_scanner_;  // MistralNameArgs
  std::string name_, arguments_;   // MistralNameArgs

  std::vector<ToolCallEvent> events_;

  // Calls past max_calls_.
  size_t max_calls_;
  size_t kept_live_ = 0;   // calls begun and not failed
  bool dropping_ = false;  // a call past max_calls_ began: the rest of the reply is dropped
};

/// One call of a collected reply.
struct ToolCall {
  std::string id, name, arguments;  ///< arguments: the JSON text of the arguments object
  size_t index = 0;                 ///< the parser's index (CallFailed refers to it)
};

/// A reply's content and calls, as events collect into them.
struct ParsedReply {
  std::string content;
  std::vector<ToolCall> calls;
};

/// Adds `events` to `reply` (a CallFailed drops its call and appends its text to content).
void collect_tool_call_events(ParsedReply& reply, const std::vector<ToolCallEvent>& events);

/// A whole reply parsed: feed(text) + finish(), collected.
ParsedReply parse_tool_calls(ToolCallFormat format, std::string_view text, std::vector<std::string> tool_names = {},
                             std::function<std::string()> make_id = {}, size_t max_calls = SIZE_MAX);

}  // namespace fdl::server
