// A reply split into content and tool calls as it arrives (tool_call_parser.h).
//
// The parser is a state machine stepped one byte at a time, so any split of the text gives
// the same events. Bytes a state holds but cannot use (a partial closing marker followed by
// something else) are replayed into the content state, which is why input_ is a buffer that
// replays are inserted into rather than a view of the chunk.
#include "server/tool_call_parser.h"

#include <algorithm>
#include <utility>

namespace fdl::server {
namespace {

// A function name in Mistral's [TOOL_CALLS]NAME[ARGS] form: the characters a request's tool
// names may have (is_tool_name_char). The bound is looser than a request's: a longer name is
// still read as a call of an unknown function, as the JSON syntaxes read any name.
constexpr size_t kMaxNameBytes = 256;
static_assert(kMaxNameBytes >= kMaxToolNameBytes, "every valid tool name must parse");

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_alnum(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

bool starts_with(std::string_view text, std::string_view prefix) { return text.substr(0, prefix.size()) == prefix; }
bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

}  // namespace

ToolCallParser::ToolCallParser(ToolCallFormat format, std::vector<std::string> tool_names,
                               std::function<std::string()> make_id, size_t max_calls)
    : format_(format), tool_names_(std::move(tool_names)), make_id_(std::move(make_id)), max_calls_(max_calls) {
  if (!make_id_) make_id_ = [f = format_] { return new_tool_call_id(f); };
  switch (format_.syntax) {
    case ToolCallSyntax::Hermes:
      markers_ = {kHermesOpen};
      break;
    case ToolCallSyntax::MistralJsonArray:
    case ToolCallSyntax::MistralNameArgs:
      markers_ = {kMistralCalls};
      break;
    case ToolCallSyntax::Llama3Json:
    case ToolCallSyntax::None:
      break;
  }
  state_ = format_.syntax == ToolCallSyntax::Llama3Json ? State::LlamaStart : State::Content;
}

std::vector<ToolCallEvent> ToolCallParser::feed(std::string_view text) {
  input_.assign(text);
  for (pos_ = 0; pos_ < input_.size();) step(input_[pos_++]);
  input_.clear();
  return take_events();
}

std::vector<ToolCallEvent> ToolCallParser::finish() {
  switch (state_) {
    case State::Content:
      release_content(true);
      break;
    case State::LlamaStart:  // only whitespace so far, or <|python_tag|> and whitespace
      if (tag_read_ != kPythonTag.size()) emit_content(held_);
      held_.clear();
      break;
    case State::HermesClose:  // a complete call, then whitespace or part of its closing marker
    case State::LlamaNext:
    case State::ArrayNext:
      held_.clear();
      break;
    case State::CallObject:  // the reply ended inside a call
    case State::ArrayOpen:
    case State::MistralName:
    case State::MistralId:
    case State::MistralArgs:
      call_failed("");
      break;
  }
  return take_events();
}

void ToolCallParser::step(char c) {
  switch (state_) {
    case State::Content:
      return step_content(c);
    case State::LlamaStart:
      return step_llama_start(c);
    case State::CallObject:
      return step_call_object(c);
    case State::HermesClose:
    case State::LlamaNext:
    case State::ArrayOpen:
    case State::ArrayNext:
      return step_after_call(c);
    case State::MistralName:
    case State::MistralId:
      return step_mistral_name(c);
    case State::MistralArgs:
      return step_mistral_args(c);
  }
}

// ---- content ----------------------------------------------------------------------------

void ToolCallParser::step_content(char c) {
  if (skip_whitespace_) {
    if (is_ws(c)) return;
    skip_whitespace_ = false;
  }
  held_ += c;
  for (const std::string_view marker : markers_) {
    if (!ends_with(held_, marker)) continue;
    std::string_view before = std::string_view(held_).substr(0, held_.size() - marker.size());
    while (!before.empty() && is_ws(before.back())) before.remove_suffix(1);  // not content: it leads to a call
    emit_content(before);
    held_.clear();
    begin_call(std::string(marker), format_.syntax == ToolCallSyntax::MistralNameArgs    ? State::MistralName
                                    : format_.syntax == ToolCallSyntax::MistralJsonArray ? State::ArrayOpen
                                                                                         : State::CallObject);
    return;
  }
  release_content(false);
}

// Sends held content except, unless the reply ended, a tail that may still become part of a
// marker (a proper prefix of one) and the whitespace before that tail.
void ToolCallParser::release_content(bool at_end) {
  size_t tail = 0;  // the marker prefix at the end
  size_t keep = 0;
  if (!at_end) {
    for (const std::string_view marker : markers_)
      for (size_t k = std::min(marker.size() - 1, held_.size()); k > tail; --k)
        if (ends_with(held_, marker.substr(0, k))) {
          tail = k;
          break;
        }
    // The whitespace before it. The scan stops where held_'s known leading whitespace
    // begins, so a long run costs O(1) per byte rather than a rescan of the run.
    keep = tail;
    while (keep < held_.size() && is_ws(held_[held_.size() - keep - 1]))
      keep = held_.size() - keep - 1 < held_ws_ ? held_.size() : keep + 1;
  }
  emit_content(std::string_view(held_).substr(0, held_.size() - keep));
  held_.erase(0, held_.size() - keep);
  held_ws_ = keep - tail;
}

void ToolCallParser::to_content(std::string replay, bool skip_whitespace) {
  state_ = State::Content;
  held_.clear();
  held_ws_ = 0;
  skip_whitespace_ = skip_whitespace;
  if (!replay.empty()) input_.insert(pos_, replay);
}

// ---- Llama 3: a reply that starts with a call ---------------------------------------------

void ToolCallParser::step_llama_start(char c) {
  const std::string_view tag = kPythonTag;
  const bool inside_tag = tag_read_ > 0 && tag_read_ < tag.size();
  if (!inside_tag && is_ws(c)) {
    held_ += c;
    return;
  }
  if (tag_read_ < tag.size() && c == tag[tag_read_]) {
    held_ += c;
    ++tag_read_;
    return;
  }
  if (c == '{' && !inside_tag) {
    // The whitespace and the tag lead to the call: not content, unless the call fails (then
    // the whitespace before a call without the tag comes back with it).
    begin_call(tag_read_ == tag.size() ? std::string() : std::move(held_), State::CallObject);
    step_call_object(c);
    return;
  }
  // The reply is not a call: all of it is content, but for a complete <|python_tag|>.
  const bool tag_done = tag_read_ == tag.size();
  std::string replay = tag_done ? std::string(1, c) : held_ + c;
  to_content(std::move(replay), tag_done);
}

// ---- calls ------------------------------------------------------------------------------

void ToolCallParser::begin_call(std::string raw, State state) {
  raw_ = std::move(raw);
  announced_ = false;
  arguments_sent_ = 0;
  object_ = ToolCallObjectReader{};
  arguments_scanner_ = JsonScanner{};
  name_.clear();
  arguments_.clear();
  held_.clear();
  held_ws_ = 0;
  state_ = state;
}

void ToolCallParser::announce(const std::string& name) {
  current_ = begun_++;
  announced_ = true;
  ToolCallEvent e;
  e.kind = ToolCallEvent::Kind::CallBegin;
  e.index = current_;
  e.id = make_id_();
  e.name = name;
  events_.push_back(std::move(e));
}

void ToolCallParser::send_arguments(const std::string& arguments) {
  if (arguments.size() <= arguments_sent_) return;
  emit_arguments(std::string_view(arguments).substr(arguments_sent_));
  arguments_sent_ = arguments.size();
}

void ToolCallParser::call_complete(State next) {
  raw_.clear();
  held_.clear();
  held_ws_ = 0;
  state_ = next;
  skip_whitespace_ = next == State::Content;
}

void ToolCallParser::call_failed(std::string replay) {
  if (announced_) {
    ToolCallEvent e;
    e.kind = ToolCallEvent::Kind::CallFailed;
    e.index = current_;
    e.text = std::move(raw_);
    events_.push_back(std::move(e));
  } else {
    emit_content(raw_);
  }
  raw_.clear();
  announced_ = false;
  to_content(std::move(replay), false);
}

void ToolCallParser::step_call_object(char c) {
  const ToolCallObjectReader::Step s = object_.feed(c);
  if (s == ToolCallObjectReader::Step::Error) return call_failed(std::string(1, c));
  raw_ += c;
  if (!announced_ && object_.name()) {
    const std::string& name = *object_.name();
    const bool unknown = std::find(tool_names_.begin(), tool_names_.end(), name) == tool_names_.end();
    if (format_.syntax == ToolCallSyntax::Llama3Json && unknown) return call_failed("");  // JSON, not a call
    announce(name);
  }
  if (announced_) send_arguments(object_.arguments());
  if (s != ToolCallObjectReader::Step::Done) return;
  switch (format_.syntax) {
    case ToolCallSyntax::Hermes:
      return call_complete(State::HermesClose);
    case ToolCallSyntax::Llama3Json:
      return call_complete(State::LlamaNext);
    default:
      return call_complete(State::ArrayNext);
  }
}

// What may follow a complete call: whitespace, then a closing marker or a separator. Anything
// else ends the calls, and the bytes are read again as content.
void ToolCallParser::step_after_call(char c) {
  if (state_ == State::ArrayOpen) {  // [TOOL_CALLS] read: '[' opens the array of calls
    if (is_ws(c) || c == '[') {
      raw_ += c;
      if (c == '[') state_ = State::CallObject;
      return;
    }
    return call_failed(std::string(1, c));
  }
  const bool before_text = held_ws_ == held_.size();
  if (before_text && is_ws(c)) {
    held_ += c;
    ++held_ws_;
    return;
  }
  if (state_ == State::HermesClose) {
    held_ += c;
    const std::string_view text = std::string_view(held_).substr(held_ws_);
    if (text == kHermesClose) return call_complete(State::Content);
    if (starts_with(kHermesClose, text)) return;
    return to_content(std::move(held_), true);
  }
  const char separator = state_ == State::LlamaNext ? ';' : ',';
  if (c == separator) return begin_call(held_ + c, State::CallObject);
  if (c == ']' && state_ == State::ArrayNext) return call_complete(State::Content);
  to_content(held_ + c, true);
}

// ---- Mistral's [TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...} ---------------------------------------

void ToolCallParser::step_mistral_name(char c) {
  const bool in_name = state_ == State::MistralName;
  if (held_.empty() && c != '[') {  // a character of the name or the id
    const bool ok = in_name ? is_tool_name_char(c) && name_.size() < kMaxNameBytes : is_alnum(c) && raw_.size() < 1024;
    if (!ok) return call_failed(std::string(1, c));
    raw_ += c;
    if (in_name) name_ += c;
    return;
  }
  held_ += c;  // a marker in progress
  raw_ += c;
  const bool call_id = in_name && held_ == kMistralCallId;
  if (call_id || held_ == kMistralArgs) {
    if (in_name) {
      if (name_.empty()) return call_failed("");
      announce(name_);
    }
    held_.clear();
    state_ = call_id ? State::MistralId : State::MistralArgs;
    return;
  }
  if (starts_with(kMistralArgs, held_) || (in_name && starts_with(kMistralCallId, held_))) return;
  raw_.pop_back();
  held_.clear();
  call_failed(std::string(1, c));
}

void ToolCallParser::step_mistral_args(char c) {
  const JsonScanner::Step s = arguments_scanner_.feed(c);
  const bool value_byte = arguments_scanner_.started();
  if (s == JsonScanner::Step::Error || (value_byte && arguments_.empty() && c != '{'))
    return call_failed(std::string(1, c));
  raw_ += c;
  if (!value_byte) return;  // whitespace before the object
  arguments_ += c;
  send_arguments(arguments_);
  if (s == JsonScanner::Step::Done) call_complete(State::Content);
}

// ---- events -----------------------------------------------------------------------------

void ToolCallParser::emit_content(std::string_view text) {
  if (text.empty()) return;
  if (!events_.empty() && events_.back().kind == ToolCallEvent::Kind::Content) {
    events_.back().text += text;
    return;
  }
  ToolCallEvent e;
  e.text = std::string(text);
  events_.push_back(std::move(e));
}

void ToolCallParser::emit_arguments(std::string_view text) {
  if (!events_.empty() && events_.back().kind == ToolCallEvent::Kind::CallArguments && events_.back().index == current_) {
    events_.back().text += text;
    return;
  }
  ToolCallEvent e;
  e.kind = ToolCallEvent::Kind::CallArguments;
  e.index = current_;
  e.text = std::string(text);
  events_.push_back(std::move(e));
}

// A call fails before the next begins, so the calls that stand are known when each call
// begins: with max_calls_ of them standing, the reply ends there, and the new call and all
// that follows it are dropped.
std::vector<ToolCallEvent> ToolCallParser::take_events() {
  if (max_calls_ != SIZE_MAX) {  // filtered in place: no allocation per delivery
    size_t kept = 0;  // events before the first dropped one are all kept, in place
    for (const ToolCallEvent& e : events_) {
      if (e.kind == ToolCallEvent::Kind::CallBegin && kept_live_ >= max_calls_) dropping_ = true;
      if (dropping_) break;
      if (e.kind == ToolCallEvent::Kind::CallBegin) ++kept_live_;
      if (e.kind == ToolCallEvent::Kind::CallFailed) --kept_live_;
      ++kept;
    }
    events_.resize(kept);
  }
  return std::exchange(events_, {});
}

void collect_tool_call_events(ParsedReply& reply, const std::vector<ToolCallEvent>& events) {
  auto find = [&](size_t index) {
    return std::find_if(reply.calls.begin(), reply.calls.end(), [&](const ToolCall& c) { return c.index == index; });
  };
  for (const ToolCallEvent& e : events) {
    switch (e.kind) {
      case ToolCallEvent::Kind::Content:
        reply.content += e.text;
        break;
      case ToolCallEvent::Kind::CallBegin:
        reply.calls.push_back(ToolCall{e.id, e.name, "", e.index});
        break;
      case ToolCallEvent::Kind::CallArguments:
        if (const auto it = find(e.index); it != reply.calls.end()) it->arguments += e.text;
        break;
      case ToolCallEvent::Kind::CallFailed:
        if (const auto it = find(e.index); it != reply.calls.end()) reply.calls.erase(it);
        reply.content += e.text;
        break;
    }
  }
}

ParsedReply parse_tool_calls(ToolCallFormat format, std::string_view text, std::vector<std::string> tool_names,
                             std::function<std::string()> make_id, size_t max_calls) {
  ToolCallParser parser(format, std::move(tool_names), std::move(make_id), max_calls);
  ParsedReply reply;
  collect_tool_call_events(reply, parser.feed(text));
  collect_tool_call_events(reply, parser.finish());
  return reply;
}

}  // namespace fdl::server
