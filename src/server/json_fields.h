// json_fields.h — typed, range-checked reads of request body fields.
//
// OpenAI's API is strict about types (a string where a number belongs is a 400 naming the
// field), so every known field goes through one of these. Absent and JSON null both mean
// "not given" (nullopt): clients such as the official Python SDK send null for unset
// optionals. Errors are ApiError 400 with `param` = the field name.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace fdl::server {

/// Deepest nesting of arrays and objects a request may hold: templates, tool-call parsing
/// and serialization walk JSON recursively, so deeper text is refused before it is parsed.
inline constexpr size_t kMaxJsonNesting = 128;

/// Throws ApiError 400 (`param`; the message names `what`) when `text` nests arrays and
/// objects more than kMaxJsonNesting deep. One pass over the bytes; strings are skipped.
void check_json_nesting(std::string_view text, const std::string& param, const std::string& what);

/// A request body as JSON. Throws ApiError 400 when it is not JSON (numbers beyond a double,
/// 1e999, included) or nests deeper than kMaxJsonNesting.
nlohmann::json parse_request_body(std::string_view text);
/// The same body keeping key order, for what chat templates print as the client wrote it
/// (tools, tool calls) and schemas; call it on a body parse_request_body accepted.
nlohmann::ordered_json parse_request_body_ordered(std::string_view text);

/// The field if present and not null, else nullptr.
const nlohmann::json* find_field(const nlohmann::json& body, const char* name);

/// An integer in [min, max]. Integral floats such as 10.0 are accepted (JSON has one number
/// type); 10.5, strings, booleans and out-of-range values are refused.
std::optional<int64_t> read_int(const nlohmann::json& body, const char* name, int64_t min,
                                int64_t max);
/// A number in [min, max] (booleans and strings refused; JSON cannot carry NaN/Infinity, and
/// numbers too large for a double fail at parse time).
std::optional<double> read_number(const nlohmann::json& body, const char* name, double min,
                                  double max);
std::optional<bool> read_bool(const nlohmann::json& body, const char* name);
std::optional<std::string> read_string(const nlohmann::json& body, const char* name);

/// "a string", "an integer", ... for messages ("expected an integer, got a string").
std::string json_type_name(const nlohmann::json& v);

}  // namespace fdl::server
