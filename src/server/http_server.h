// http_server.h — the OpenAI-compatible HTTP front end over an Engine (cpp-httplib).
//
// Routes (docs/SERVER.md): POST /v1/completions, POST /v1/chat/completions, GET /v1/models,
// GET /v1/models/{id}, POST /tokenize, /detokenize and /apply-template, GET /health,
// GET /metrics, GET and POST /admin/breakers.
// With API keys, every route but /health needs `Authorization: Bearer KEY` with one of them
// (401 otherwise); /metrics too unless `metrics_public`. /health stays open for probes.
//
// Lifecycle: construct → bind() (returns the port; port 0 picks a free one) → run() blocks
// serving until stop(). Graceful shutdown is begin_drain() (generation requests get 503 and
// /health reports "draining"), Engine::drain(), wait for active_requests() to reach 0 (the
// last chunks of running streams are written), then stop().
//
// Threading: httplib serves each connection on a pool thread (`http_threads` of them; one
// streaming response occupies one thread for its duration, so this bounds concurrent
// streams). Engine output reaches the HTTP thread through a RequestStream. A streaming
// client that disconnects is noticed at the next write (a token chunk, or a keep-alive
// comment after 1 s of silence) and its engine requests are aborted, which frees their KV
// blocks. A non-streaming request runs to completion even if its client has gone (bounded by
// max_tokens and the context).
// Errors: every client error is a 4xx with an OpenAI error body; nothing a client sends can
// end the process. A failure inside the server is a 500 that names only a request id, its
// text is logged under that id (internal_error). bind() throws std::runtime_error when the
// address cannot be bound.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "flashdllm/engine.h"
#include "flashdllm/sampling.h"
#include "server/api_keys.h"
#include "server/chat_renderer.h"

namespace fdl::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                      ///< 0 = any free port (bind() returns it)
  ApiKeys api_keys;                      ///< none = no authentication
  bool metrics_public = false;          ///< /metrics open even with API keys
  bool fault_injection = false;         ///< POST /admin/faults (soak tests; never in production)
  int64_t max_queue = 0;                ///< waiting requests before 429; 0 = unbounded
  std::string served_model_name;        ///< the `model` reported and listed
  std::optional<ChatRenderer> chat;     ///< nullopt = chat requests are refused
  /// Sampling values for fields a request leaves out: OpenAI's defaults, with the model's
  /// recommended ones (general.sampling.*, generation_config.json) over them.
  SamplingParams sampling_defaults;
  size_t max_body_bytes = 1 << 20;      ///< larger request bodies get 413
  int http_threads = 64;                ///< connection threads (bounds concurrent streams)
};

class HttpServer {
 public:
  /// `engine` must outlive the server.
  HttpServer(Engine& engine, ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// Binds host:port and starts listening; returns the bound port. Throws std::runtime_error.
  int bind();
  /// Serves until stop(); returns false if the server failed.
  bool run();
  /// Generation requests from now on get 503; /health says "draining".
  void begin_drain();
  /// Requests being generated or streamed right now.
  size_t active_requests() const;
  /// Stops accepting and ends run(); open streams are cut, so drain first. Thread-safe.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fdl::server
