// tool_call_format.h — internal: the syntax in which a model writes tool calls, as its chat
// template writes them in an assistant turn, and the ids its template accepts.
//
// Syntaxes (the text of a reply; NAME the function, ARGS the arguments object as JSON):
//  - Hermes (Hermes 2 Pro / 3, Qwen 2.5 / 3, QwQ, Granite 4, ...): one block per call,
//      <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>
//    anywhere in the reply, several allowed, text around them is content.
//  - Llama3Json (Llama 3.1 / 3.2 / 3.3): the whole reply is the call,
//      {"name": "NAME", "parameters": ARGS}
//    optionally after <|python_tag|>; "arguments" is accepted for "parameters"; several
//    calls separated by ';' are read (the template itself renders only one per turn).
//  - MistralJsonArray (Mistral Nemo): [TOOL_CALLS][{"name": "NAME",
//    "arguments": ARGS, "id": "ID"}, ...] (the id key optional).
//  - MistralNameArgs (Mistral Small 3.2, Devstral, Ministral 3): per call
//      [TOOL_CALLS]NAME[ARGS]ARGS       or, where the template writes ids,
//      [TOOL_CALLS]NAME[CALL_ID]ID[ARGS]ARGS
//  - None: the template has none of these (or no tool calls at all); replies stay text.
//
// Detection renders a probe conversation (a user turn, an assistant turn calling a probe
// function, the tool's result) with the template and looks for how the probe call came out,
// so the parser reads exactly what the template writes, including its spacing. The probe is
// rendered with a long "call_..." id and, if the template refuses it, with a 9-character one
// (Mistral templates raise "Tool call IDs should be alphanumeric strings with length 9!"):
// that decides the ids the server generates.
// Thread-safety: pure functions; new_tool_call_id uses a thread-local generator.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace fdl::jinja {
class Template;
}

namespace fdl::server {

enum class ToolCallSyntax { None, Hermes, Llama3Json, MistralJsonArray, MistralNameArgs };

struct ToolCallFormat {
  ToolCallSyntax syntax = ToolCallSyntax::None;
  /// The template refuses tool-call ids that are not 9 characters long (Mistral's).
  bool nine_char_ids = false;
  /// MistralNameArgs: the template writes `[CALL_ID]ID` between the name and `[ARGS]`.
  bool call_id_marker = false;

  bool operator==(const ToolCallFormat&) const = default;
};

/// The tool-call syntax `tmpl` writes; None when the probe renders no call this module
/// knows, or the template fails on the probe. Never throws.
ToolCallFormat detect_tool_call_format(const jinja::Template& tmpl);

/// Classifies a rendering of the probe conversation (detect_tool_call_format's second half,
/// for tests). `nine_char_ids` is passed through.
ToolCallFormat classify_probe_rendering(std::string_view rendered, bool nine_char_ids);

/// "hermes", "llama3_json", "mistral_json_array", "mistral_name_args" or "none" (logs, docs).
std::string_view tool_call_syntax_name(ToolCallSyntax s);

/// A fresh id for a call the model made: 9 random alphanumerics where the template needs
/// them, else "call_" and 24 random alphanumerics.
std::string new_tool_call_id(const ToolCallFormat& format);

/// Function names a request may give its tools: OpenAI's ^[a-zA-Z0-9_-]{1,64}$, and '.' and
/// ':', which some clients use for namespaces. The request refuses any other name, so every
/// name the grammar can force is one the parser reads back as a call (Mistral's
/// [TOOL_CALLS]NAME has no delimiter of its own, so the parser must know the characters).
inline constexpr size_t kMaxToolNameBytes = 64;
bool is_tool_name_char(char c);
/// 1 to kMaxToolNameBytes bytes, each is_tool_name_char.
bool is_valid_tool_name(std::string_view name);

/// The marker texts of the syntaxes (special tokens in the models' vocabularies).
inline constexpr std::string_view kHermesOpen = "<tool_call>";
inline constexpr std::string_view kHermesClose = "</tool_call>";
inline constexpr std::string_view kPythonTag = "<|python_tag|>";
inline constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
inline constexpr std::string_view kMistralArgs = "[ARGS]";
inline constexpr std::string_view kMistralCallId = "[CALL_ID]";

}  // namespace fdl::server
