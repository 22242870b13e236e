// server_metrics.h — what GET /metrics exposes (Prometheus text format, docs/SERVER.md lists
// every series) and where each number comes from.
//
//  - per-request latencies, observed when an engine request finishes: time to first token,
//    inter-token latency (one observation per gap), queue time, end-to-end (HTTP request in →
//    final output), all in milliseconds;
//  - finished requests by finish_reason (stop / length / abort / error), HTTP responses by
//    status code;
//  - engine state read at scrape time from Engine::metrics()/breakers(): running and waiting
//    requests, KV blocks (total/free/cached/used) and bytes, prefix-cache queries/hits and hit
//    rate, speculation drafted/accepted and acceptance rate, preemptions, prompt and
//    generation tokens, breaker states as 0/1 gauges labelled by name.
// Engine totals are mirrored into Prometheus counters by adding the growth since the last
// scrape, so the counters stay monotonic even though the engine owns the numbers.
// Thread-safety: every method may be called from any thread.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "flashdllm/engine.h"
#include "metrics/prometheus.h"

namespace fdl::server {

class ServerMetrics {
 public:
  ServerMetrics();

  /// One engine request's final output; `e2e_ms` from HTTP arrival to this output.
  void observe_finished(const RequestOutput& final_output, double e2e_ms);
  /// One HTTP response sent with `status`.
  void count_response(int status);
  /// One generation request refused before reaching the engine, by `reason` ("queue_full").
  void count_rejected(const std::string& reason);

  /// Refreshes the engine-derived series and renders everything.
  std::string render(const EngineMetrics& engine, const std::vector<BreakerState>& breakers);

 private:
  void count_rejected_by(const std::string& reason, double n);

  metrics::Registry registry_;
  metrics::Histogram& ttft_;
  metrics::Histogram& itl_;
  metrics::Histogram& queue_;
  metrics::Histogram& e2e_;

  std::mutex mirror_mu_;  // guards last_ (render() may run concurrently)
  EngineMetrics last_{};
};

}  // namespace fdl::server
