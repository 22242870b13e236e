#include "server/http_server.h"

#include <algorithm>
#include <httplib.h>
#include <sys/socket.h>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <string_view>

#include "control/control_command.h"
#include "metrics/prometheus.h"
#include "server/content_length.h"
#include "server/generation_handler.h"
#include "server/token_endpoints.h"
#include "server/json_fields.h"
#include "server/openai_error.h"
#include "server/server_context.h"

namespace fdl::server {
namespace {

// The methods a route of this server takes ("" for a path it does not serve), for 405s.
std::string allowed_methods(const std::string& path, bool fault_injection) {
  if (path == "/v1/completions" || path == "/v1/chat/completions") return "POST";
  if (path == "/admin/breakers") return "GET, POST";
  if (path == "/admin/faults") return fault_injection ? "POST" : "";
  if (path == "/v1/models" || path == "/health" || path == "/metrics") return "GET";
  if (path.starts_with("/v1/models/") && path.size() > std::string_view("/v1/models/").size()) return "GET";
  return "";
}

using nlohmann::json;

// Debian builds cpp-httplib with a listen backlog of 5; a burst of clients connecting at once
// would see dropped SYNs and 1 s retransmits. listen() again on the bound socket raises it.
constexpr int kListenBacklog = 512;

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  for (const auto& [name, value] : e.headers()) res.set_header(name, value);
  send_json(res, e.status(), error_body(e));
}

// With API keys, what needs one: everything served but the /health probe (and /metrics when
// the operator made it public for a scraper without credentials).
bool needs_auth(const std::string& path, bool metrics_public) {
  if (path == "/metrics") return !metrics_public;
  return path.rfind("/v1/", 0) == 0 || path == "/v1" || path.rfind("/admin/", 0) == 0 || path == "/tokenize" ||
         path == "/detokenize" || path == "/apply-template";
}

json breakers_json(const Engine& engine) {
  json list = json::array();
  for (const BreakerState& b : engine.breakers()) {
    list.push_back({{"name", b.name}, {"open", b.open}, {"trips", b.trips}, {"reason", b.reason}});
  }
  return {{"breakers", std::move(list)}};
}

json model_json(const ServerContext& ctx) {
  return {{"id", ctx.options.served_model_name},
          {"object", "model"},
          {"created", ctx.started_unix},
          {"owned_by", "flashdllm"}};
}

}  // namespace

struct HttpServer::Impl {
  Impl(Engine& engine, ServerOptions options) : ctx(engine, std::move(options)) {}

  ServerContext ctx;
  httplib::Server http;
  int listen_fd = -1;

  // Runs `fn` and turns every failure into an OpenAI error response.
  template <class Fn>
  void guarded(httplib::Response& res, Fn&& fn) {
    try {
      fn();
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const std::exception& e) {
      send_error(res, internal_error(std::string("request failed: ") + e.what()));
    }
  }

  void routes() {
    auto generation = [this](Endpoint ep) {
      return [this, ep](const httplib::Request& req, httplib::Response& res) {
        guarded(res, [&] {
          const json body = parse_request_body(req.body);
          // Key order matters for tools (templates print them) and schemas (properties come out
          // in the schema's order).
          const nlohmann::ordered_json ordered = parse_request_body_ordered(req.body);
          handle_generation(ctx, body, ep, ctx.options.api_keys.cache_scope(req.get_header_value("Authorization")),
                            res, &ordered);
        });
      };
    };
    http.Post("/v1/completions", generation(Endpoint::Completions));
    http.Post("/v1/chat/completions", generation(Endpoint::Chat));

    auto tokens = [this](json (*handler)(const Tokenizer&, const json&)) {
      return [this, handler](const httplib::Request& req, httplib::Response& res) {
        guarded(res, [&] { send_json(res, 200, handler(ctx.engine.tokenizer(), parse_request_body(req.body))); });
      };
    };
    http.Post("/tokenize", tokens(handle_tokenize));
    http.Post("/detokenize", tokens(handle_detokenize));
    http.Post("/apply-template", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(res, [&] {
        const json body = parse_request_body(req.body);
        const nlohmann::ordered_json ordered = parse_request_body_ordered(req.body);
        send_json(res, 200, handle_apply_template(ctx.engine.tokenizer(), ctx.options, body, &ordered));
      });
    });

    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      send_json(res, 200, {{"object", "list"}, {"data", json::array({model_json(ctx)})}});
    });
    http.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      if (req.matches[1] == ctx.options.served_model_name) {
        send_json(res, 200, model_json(ctx));
      } else {
        send_error(res, ApiError(404, "model '" + std::string(req.matches[1]) + "' does not exist",
                                 "model", "invalid_request_error", "model_not_found"));
      }
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      if (ctx.draining) {
        send_json(res, 503, {{"status", "draining"}});
      } else {
        send_json(res, 200, {{"status", "ok"}});
      }
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      guarded(res, [&] {
        res.status = 200;
        res.set_content(ctx.metrics->render(ctx.engine.metrics(), ctx.engine.breakers()),
                        metrics::kContentType);
      });
    });
    http.Get("/admin/breakers", [this](const httplib::Request&, httplib::Response& res) {
      send_json(res, 200, breakers_json(ctx.engine));
    });
    http.Post("/admin/breakers", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(res, [&] {
        control::ControlCommand cmd;
        try {
          cmd = control::parse_control_command(req.body);
        } catch (const std::invalid_argument& e) {
          throw ApiError(400, e.what());
        }
        try {
          if (cmd.action == "trip") {
            ctx.engine.trip_breaker(cmd.breaker, cmd.reason.empty() ? "via /admin/breakers" : cmd.reason);
          } else {
            ctx.engine.reset_breaker(cmd.breaker);
          }
        } catch (const std::invalid_argument& e) {
          throw ApiError(400, e.what(), "breaker");
        }
        spdlog::info("breaker '{}' {} via /admin/breakers", cmd.breaker, cmd.action);
        send_json(res, 200, breakers_json(ctx.engine));
      });
    });
    if (ctx.options.fault_injection) {
      // {"fault": "disk_read_eio" | ... | "flip_bit", "count": N}: Engine::inject_fault.
      http.Post("/admin/faults", [this](const httplib::Request& req, httplib::Response& res) {
        guarded(res, [&] {
          const json body = parse_request_body(req.body);
          if (!body.is_object() || !body.contains("fault") || !body["fault"].is_string())
            throw ApiError(400, "'fault' must be a string", "fault");
          if (body.contains("count") && !body["count"].is_number_integer())
            throw ApiError(400, "'count' must be an integer", "count");
          const std::string fault = body["fault"].get<std::string>();
          const int64_t count = body.value("count", int64_t(1));
          int applied = 0;
          try {
            // Clamped only to fit an int: the engine refuses counts outside 1..1000 itself.
            applied = ctx.engine.inject_fault(fault, int(std::clamp<int64_t>(count, 0, 1001)));
          } catch (const std::invalid_argument& e) {
            throw ApiError(400, e.what(), "fault");
          }
          spdlog::warn("fault '{}' x{} injected via /admin/faults ({} applied)", fault, count, applied);
          send_json(res, 200, json{{"fault", fault}, {"count", count}, {"applied", applied}});
        });
      });
    }
  }

  void hooks() {
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      // Runs before cpp-httplib reads the body: a Content-Length it would misparse (waiting
      // 5 s on "-1", reading "1e3" as 1 byte) or one over the limit is answered now, with
      // "Connection: close" since the body was not read (server/content_length.h).
      if (req.has_header("Content-Length")) {
        try {
          check_content_length(req.get_header_value("Content-Length"), ctx.options.max_body_bytes);
        } catch (const ApiError& e) {
          send_error(res, e);
          if (req.get_header_value("Connection") != "close") res.set_header("Connection", "close");
          return httplib::Server::HandlerResponse::Handled;
        }
      }
      if (ctx.options.api_keys.empty() || !needs_auth(req.path, ctx.options.metrics_public)) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      const std::string given = req.get_header_value("Authorization");
      if (ctx.options.api_keys.match(given)) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      send_error(res, ApiError(401,
                               given.empty() ? "missing API key: send 'Authorization: Bearer KEY'"
                                             : "incorrect API key",
                               "", "invalid_request_error", "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    });
    // Errors httplib produces itself (404 no route, 413 body too large, 400 bad request
    // line) arrive with an empty body: give them the OpenAI shape too. A known path asked
    // with another method is 405 with the methods it takes (httplib says 404).
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      std::string message;
      if (res.status == 404) {
        if (const std::string allowed = allowed_methods(req.path, ctx.options.fault_injection); !allowed.empty()) {
          res.status = 405;
          res.set_header("Allow", allowed);
          message = req.method + " is not allowed on " + req.path + " (allowed: " + allowed + ")";
        }
      }
      switch (res.status) {
        case 405: break;
        case 404: message = "no route for " + req.method + " " + req.path; break;
        case 413:
          // cpp-httplib caps form-encoded bodies (curl -d's default Content-Type) at 8 KiB
          // whatever --max-body-bytes says: name the real cause.
          message = req.get_header_value("Content-Type").starts_with("application/x-www-form-urlencoded")
                        ? "form-encoded request bodies are limited to 8192 bytes: send JSON with "
                          "'Content-Type: application/json' (curl: -H 'Content-Type: application/json')"
                        : "the request body is larger than the server accepts (--max-body-bytes)";
          break;
        default: message = "HTTP " + std::to_string(res.status);
      }
      send_json(res, res.status, error_body(message, "invalid_request_error"));
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      send_error(res, internal_error("unhandled exception in a request: " + what));
    });
    http.set_logger([this](const httplib::Request&, const httplib::Response& res) {
      ctx.metrics->count_response(res.status);
    });
    http.set_payload_max_length(ctx.options.max_body_bytes);
    const size_t threads = size_t(ctx.options.http_threads);
    http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    http.set_socket_options([this](int fd) {
      const int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      listen_fd = fd;
    });
  }
};

HttpServer::HttpServer(Engine& engine, ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, std::move(options))) {
  impl_->routes();
  impl_->hooks();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  const ServerOptions& o = impl_->ctx.options;
  int port = o.port;
  if (port == 0) {
    port = impl_->http.bind_to_any_port(o.host);
    if (port < 0) throw std::runtime_error("cannot bind " + o.host + " to a free port");
  } else if (!impl_->http.bind_to_port(o.host, port)) {
    throw std::runtime_error("cannot bind " + o.host + ":" + std::to_string(port) +
                             " (address in use, or not a local address)");
  }
  if (impl_->listen_fd >= 0) ::listen(impl_->listen_fd, kListenBacklog);
  return port;
}

bool HttpServer::run() { return impl_->http.listen_after_bind(); }

void HttpServer::begin_drain() { impl_->ctx.draining = true; }

size_t HttpServer::active_requests() const { return impl_->ctx.active.load(); }

void HttpServer::stop() { impl_->http.stop(); }

}  // namespace fdl::server
