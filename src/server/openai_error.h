// openai_error.h — the error the request handlers throw for anything a client got wrong, and
// the OpenAI-style JSON body it becomes:
//   {"error":{"message":"...","type":"invalid_request_error","param":"max_tokens","code":null}}
//
// Why one exception type: parsing and validation run deep inside helpers; throwing ApiError
// with the HTTP status and the offending parameter lets every helper report precisely, and
// the HTTP layer turns it into one response without knowing where it came from.
// Thread-safety: plain values.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace fdl::server {

class ApiError : public std::runtime_error {
 public:
  /// `status`: HTTP status (4xx for client errors, 5xx for server-side ones). `param`: the
  /// request field at fault ("" = none → JSON null). `code`: OpenAI's machine-readable code,
  /// e.g. "context_length_exceeded" ("" → null).
  ApiError(int status, const std::string& message, std::string param = {},
           std::string type = "invalid_request_error", std::string code = {});

  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& type() const { return type_; }
  const std::string& code() const { return code_; }
  /// Response headers the error comes with (X-Request-Id, Retry-After).
  const std::vector<std::pair<std::string, std::string>>& headers() const { return headers_; }
  ApiError& with_header(std::string name, std::string value) {
    headers_.emplace_back(std::move(name), std::move(value));
    return *this;
  }

 private:
  int status_;
  std::string param_;
  std::string type_;
  std::string code_;
  std::vector<std::pair<std::string, std::string>> headers_;
};

/// A 500 for a failure inside the server. Its text (`detail`: an exception's what(), an
/// engine error) may name files, addresses or internals that are no client's business, so
/// the client gets only "internal error (request id ID)" and an `X-Request-Id: ID` header,
/// while the log gets `detail` under the same id for whoever debugs it.
ApiError internal_error(const std::string& detail);

/// 400 invalid_request_error naming `param`.
ApiError invalid_param(const std::string& param, const std::string& message);

/// The JSON error body for `e`.
nlohmann::json error_body(const ApiError& e);
/// The JSON error body from its parts (empty param/code → null).
nlohmann::json error_body(const std::string& message, const std::string& type,
                          const std::string& param = {}, const std::string& code = {});

/// Serializes JSON for the wire: compact, and any invalid UTF-8 inside strings becomes U+FFFD
/// instead of throwing (token pieces can be partial UTF-8 sequences).
std::string dump_json(const nlohmann::json& j);

}  // namespace fdl::server
