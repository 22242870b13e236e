// server_context.h — internal: the state the HTTP handlers share (one per HttpServer).
// Thread-safety: read by every HTTP thread at once; the mutable parts are atomics, the
// metrics object is itself thread-safe, and the Engine's methods are all thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "flashdllm/engine.h"
#include "grammar/grammar_cache.h"
#include "server/http_server.h"
#include "server/queue_limit.h"
#include "server/server_metrics.h"

namespace fdl::server {

struct ServerContext {
  ServerContext(Engine& e, ServerOptions o)
      : engine(e), options(std::move(o)), metrics(std::make_shared<ServerMetrics>()),
        queue(options.max_queue) {}

  Engine& engine;
  const ServerOptions options;
  /// Shared with engine sinks: the Engine may deliver a final "abort" from its destructor,
  /// after the HttpServer (and this context) are gone.
  std::shared_ptr<ServerMetrics> metrics;
  /// Compiled output grammars (response_format, grammar, tools), shared by equal requests.
  grammar::GrammarCache grammars;
  QueueLimit queue;  ///< --max-queue
  std::atomic<bool> draining{false};
  std::atomic<size_t> active{0};  ///< generation requests in flight (see ActiveGuard)
  const int64_t started_unix =
      std::chrono::duration_cast<std::chrono::seconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count();
};

/// Counts one in-flight generation request for as long as it lives; held by the handler or,
/// for streams, by the content provider (which httplib destroys after the last write).
class ActiveGuard {
 public:
  explicit ActiveGuard(std::atomic<size_t>& n) : n_(n) { ++n_; }
  ~ActiveGuard() { --n_; }
  ActiveGuard(const ActiveGuard&) = delete;
  ActiveGuard& operator=(const ActiveGuard&) = delete;

 private:
  std::atomic<size_t>& n_;
};

}  // namespace fdl::server
