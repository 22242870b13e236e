#include "server/json_fields.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/json_error_text.h"
#include "server/openai_error.h"
#include "server/ordered_json_parser.h"

namespace fdl::server {
namespace {

std::string number_text(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  // Shorter when the short form round-trips (1e+09 rather than 1000000000.0000000).
  char shorter[40];
  std::snprintf(shorter, sizeof shorter, "%g", v);
  return std::strtod(shorter, nullptr) == v ? shorter : buf;
}

}  // namespace

void check_json_nesting(std::string_view text, const std::string& param, const std::string& what) {
  size_t depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonNesting)
        throw ApiError(400, what + " nests arrays and objects more than " + std::to_string(kMaxJsonNesting) +
                                " levels deep", param);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

std::string json_type_name(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::boolean: return "a boolean";
    case nlohmann::json::value_t::string: return "a string";
    case nlohmann::json::value_t::array: return "an array";
    case nlohmann::json::value_t::object: return "an object";
    case nlohmann::json::value_t::number_float: return "a number";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return "an integer";
    default: return "an unsupported value";
  }
}

nlohmann::json parse_request_body(std::string_view text) {
  check_json_nesting(text, "", "the request body");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse errors, and numbers beyond a double (1e999)
    throw ApiError(400, "the request body is not valid JSON: " + json_error_text(e));
  }
}

nlohmann::ordered_json parse_request_body_ordered(std::string_view text) {
  return parse_ordered_json(text);
}

const nlohmann::json* find_field(const nlohmann::json& body, const char* name) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<int64_t> read_int(const nlohmann::json& body, const char* name, int64_t min,
                                int64_t max) {
  const nlohmann::json* v = find_field(body, name);
  if (v == nullptr) return std::nullopt;
  // Appended piecewise: `"[" + std::string` trips a GCC 12 -Wrestrict false positive.
  std::string range("[");
  range.append(std::to_string(min)).append(", ").append(std::to_string(max)).append("]");
  int64_t value = 0;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u > uint64_t(max)) {
      throw invalid_param(name, std::string("'") + name + "' must be an integer in " + range +
                                    ", got " + std::to_string(u));
    }
    value = int64_t(u);
  } else if (v->is_number_integer()) {
    value = v->get<int64_t>();
  } else if (v->is_number_float()) {
    const double d = v->get<double>();
    // Beyond 2^53 every double is integral but the cast could overflow: range-check first.
    if (d != std::floor(d) || d < double(min) || d > double(max)) {
      throw invalid_param(name, std::string("'") + name + "' must be an integer in " + range +
                                    ", got " + number_text(d));
    }
    value = int64_t(d);
  } else {
    throw invalid_param(name, std::string("'") + name + "' must be an integer, got " +
                                  json_type_name(*v));
  }
  if (value < min || value > max) {
    throw invalid_param(name, std::string("'") + name + "' must be an integer in " + range +
                                  ", got " + std::to_string(value));
  }
  return value;
}

std::optional<double> read_number(const nlohmann::json& body, const char* name, double min,
                                  double max) {
  const nlohmann::json* v = find_field(body, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) {
    throw invalid_param(name, std::string("'") + name + "' must be a number, got " +
                                  json_type_name(*v));
  }
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < min || d > max) {
    throw invalid_param(name, std::string("'") + name + "' must be a number in [" +
                                  number_text(min) + ", " + number_text(max) + "], got " +
                                  number_text(d));
  }
  return d;
}

std::optional<bool> read_bool(const nlohmann::json& body, const char* name) {
  const nlohmann::json* v = find_field(body, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) {
    throw invalid_param(name, std::string("'") + name + "' must be a boolean, got " +
                                  json_type_name(*v));
  }
  return v->get<bool>();
}

std::optional<std::string> read_string(const nlohmann::json& body, const char* name) {
  const nlohmann::json* v = find_field(body, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) {
    throw invalid_param(name, std::string("'") + name + "' must be a string, got " +
                                  json_type_name(*v));
  }
  return v->get<std::string>();
}

}  // namespace fdl::server
