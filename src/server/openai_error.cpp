#include "server/openai_error.h"

#include "server/response_json.h"

#include <utility>

#include <spdlog/spdlog.h>

namespace fdl::server {

ApiError::ApiError(int status, const std::string& message, std::string param, std::string type,
                   std::string code)
    : std::runtime_error(message),
      status_(status),
      param_(std::move(param)),
      type_(std::move(type)),
      code_(std::move(code)) {}

ApiError invalid_param(const std::string& param, const std::string& message) {
  return ApiError(400, message, param);
}

ApiError internal_error(const std::string& detail) {
  const std::string id = new_response_id("");
  spdlog::error("internal error (request id {}): {}", id, detail);
  ApiError e(500, "internal error (request id " + id + ")", "", "server_error");
  e.with_header("X-Request-Id", id);
  return e;
}

nlohmann::json error_body(const std::string& message, const std::string& type,
                          const std::string& param, const std::string& code) {
  nlohmann::json err = {{"message", message}, {"type", type}};
  err["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
  err["code"] = code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code);
  return {{"error", std::move(err)}};
}

nlohmann::json error_body(const ApiError& e) {
  return error_body(e.what(), e.type(), e.param(), e.code());
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace fdl::server
