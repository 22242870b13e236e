#include "server/server_metrics.h"

namespace fdl::server {
namespace {

// Adds the growth of an engine total to a mirrored counter (never negative).
void mirror(metrics::Counter& c, double now, double before) {
  if (now > before) c.inc(now - before);
}

}  // namespace

ServerMetrics::ServerMetrics()
    : ttft_(registry_.histogram("flashdllm_time_to_first_token_ms",
                                "Time from submission to the first generated token (ms)",
                                metrics::latency_buckets_ms())),
      itl_(registry_.histogram("flashdllm_inter_token_latency_ms",
                               "Time between consecutive generated tokens (ms)",
                               metrics::latency_buckets_ms())),
      queue_(registry_.histogram("flashdllm_queue_time_ms",
                                 "Time from submission to admission by the scheduler (ms)",
                                 metrics::latency_buckets_ms())),
      e2e_(registry_.histogram("flashdllm_e2e_request_latency_ms",
                               "Time from HTTP request arrival to the request's last output (ms)",
                               metrics::latency_buckets_ms())) {
  count_rejected_by("queue_full", 0);  // listed from the start, so a scraper sees it at 0
}

void ServerMetrics::observe_finished(const RequestOutput& out, double e2e_ms) {
  registry_
      .counter("flashdllm_requests_finished_total", "Engine requests finished, by finish reason",
               {{"finish_reason", out.finish_reason}})
      .inc();
  if (out.timings.gen_tokens > 0) ttft_.observe(out.timings.ttft_ms);
  for (const double gap : out.timings.token_latencies_ms) itl_.observe(gap);
  queue_.observe(out.queue_ms);
  e2e_.observe(e2e_ms);
}

void ServerMetrics::count_response(int status) {
  registry_
      .counter("flashdllm_http_responses_total", "HTTP responses sent, by status code",
               {{"code", std::to_string(status)}})
      .inc();
}

void ServerMetrics::count_rejected(const std::string& reason) { count_rejected_by(reason, 1); }

void ServerMetrics::count_rejected_by(const std::string& reason, double n) {
  registry_
      .counter("flashdllm_requests_rejected_total", "Generation requests refused before reaching the engine, by reason",
               {{"reason", reason}})
      .inc(n);
}

std::string ServerMetrics::render(const EngineMetrics& m, const std::vector<BreakerState>& breakers) {
  auto gauge = [&](const char* name, const char* help, double v) {
    registry_.gauge(name, help).set(v);
  };
  gauge("flashdllm_requests_running", "Requests admitted and not finished", double(m.running));
  gauge("flashdllm_requests_waiting", "Requests queued, not yet admitted (preempted included)",
        double(m.waiting));
  const double used = double(m.kv_blocks_total) - double(m.kv_blocks_free) - double(m.kv_blocks_cached);
  gauge("flashdllm_kv_blocks_total", "KV cache blocks in the pool", double(m.kv_blocks_total));
  gauge("flashdllm_kv_blocks_free", "KV cache blocks free", double(m.kv_blocks_free));
  gauge("flashdllm_kv_blocks_cached",
        "KV cache blocks held only by the prefix cache (evictable)", double(m.kv_blocks_cached));
  gauge("flashdllm_kv_blocks_used", "KV cache blocks held by requests", used);
  gauge("flashdllm_kv_block_bytes", "Bytes per KV cache block", double(m.kv_block_bytes));
  // The cache's configuration as labels of a constant 1 (vLLM's cache_config_info pattern).
  registry_
      .gauge("flashdllm_kv_cache_info", "KV cache configuration (value always 1)",
             {{"dtype", kv_dtype_name(m.kv_dtype)}, {"block_size", std::to_string(m.kv_block_size)}})
      .set(1);
  gauge("flashdllm_kv_bytes_total", "Bytes of the KV cache pool",
        double(m.kv_blocks_total) * double(m.kv_block_bytes));
  gauge("flashdllm_kv_bytes_used", "Bytes of KV cache blocks held by requests",
        used * double(m.kv_block_bytes));
  gauge("flashdllm_kv_usage_ratio", "Fraction of KV blocks held by requests",
        m.kv_blocks_total > 0 ? used / double(m.kv_blocks_total) : 0.0);
  gauge("flashdllm_prefix_cache_hit_rate",
        "Prompt tokens served from the prefix cache / prompt tokens looked up",
        m.prefix_cache_queries > 0 ? double(m.prefix_cache_hits) / double(m.prefix_cache_queries)
                                   : 0.0);
  gauge("flashdllm_spec_acceptance_rate", "Accepted / drafted speculative tokens",
        m.spec.drafted > 0 ? double(m.spec.accepted) / double(m.spec.drafted) : 0.0);
  for (const BreakerState& b : breakers) {
    registry_
        .gauge("flashdllm_breaker_open", "1 when the named breaker is open (feature off)",
               {{"name", b.name}})
        .set(b.open ? 1.0 : 0.0);
    registry_
        .gauge("flashdllm_breaker_trips", "Times the named breaker has opened", {{"name", b.name}})
        .set(double(b.trips));
  }
  {
    std::lock_guard lock(mirror_mu_);
    auto counter = [&](const char* name, const char* help) -> metrics::Counter& {
      return registry_.counter(name, help);
    };
    mirror(counter("flashdllm_prompt_tokens_total", "Prompt tokens of admitted requests"),
           double(m.prompt_tokens), double(last_.prompt_tokens));
    mirror(counter("flashdllm_generation_tokens_total", "Tokens generated"),
           double(m.generation_tokens), double(last_.generation_tokens));
    mirror(counter("flashdllm_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache"),
           double(m.prefix_cache_queries), double(last_.prefix_cache_queries));
    mirror(counter("flashdllm_prefix_cache_hits_total", "Prompt tokens served from the prefix cache"),
           double(m.prefix_cache_hits), double(last_.prefix_cache_hits));
    mirror(counter("flashdllm_spec_drafted_tokens_total", "Speculative draft tokens verified"),
           double(m.spec.drafted), double(last_.spec.drafted));
    mirror(counter("flashdllm_spec_accepted_tokens_total", "Speculative draft tokens accepted"),
           double(m.spec.accepted), double(last_.spec.accepted));
    mirror(counter("flashdllm_spec_tree_steps_total",
                   "Speculative verifications of a token tree (several candidate drafts, --spec-tree on)"),
           double(m.spec.tree_steps), double(last_.spec.tree_steps));
    mirror(counter("flashdllm_spec_tree_alt_accepted_tokens_total",
                   "Draft tokens accepted on a token tree's non-first branches"),
           double(m.spec.tree_alt_accepted), double(last_.spec.tree_alt_accepted));
    mirror(counter("flashdllm_grammar_forced_drafted_tokens_total",
                   "Draft tokens spelling text a request's grammar forces (docs/GRAMMARS.md)"),
           double(m.spec.forced_drafted), double(last_.spec.forced_drafted));
    mirror(counter("flashdllm_grammar_forced_accepted_tokens_total", "Grammar-forced draft tokens accepted"),
           double(m.spec.forced_accepted), double(last_.spec.forced_accepted));
    mirror(counter("flashdllm_grammar_rows_total", "Logits rows masked by a request's grammar"),
           double(m.grammar_rows), double(last_.grammar_rows));
    mirror(counter("flashdllm_grammar_seconds_total", "Host time spent on grammar masks and drafts"),
           m.grammar_ms / 1000.0, last_.grammar_ms / 1000.0);
    mirror(counter("flashdllm_preemptions_total", "Requests preempted for lack of KV blocks"),
           double(m.preemptions), double(last_.preemptions));
    mirror(counter("flashdllm_requests_submitted_total", "Engine requests submitted"),
           double(m.requests_submitted), double(last_.requests_submitted));
    mirror(counter("flashdllm_engine_steps_total", "Engine forwards run"), double(m.steps),
           double(last_.steps));
    mirror(counter("flashdllm_prefill_tokens_computed_total",
                   "Prompt tokens run through the model (prefix-cache hits excluded)"),
           double(m.prefill_tokens_computed), double(last_.prefill_tokens_computed));
    mirror(counter("flashdllm_recomputed_tokens_total",
                   "Tokens prefilled again after a preemption or a lost cached block"),
           double(m.recomputed_tokens), double(last_.recomputed_tokens));
    // KV tiers (docs/KV_TIERS.md): occupancy per tier, blocks and bytes moved per direction,
    // what happened to evicted prefix-cache blocks, checksum failures.
    static const char* kTier[3] = {"device", "host", "disk"};
    const auto& kt = m.kv_tiers;
    const auto& lt = last_.kv_tiers;
    for (size_t t = 0; t < 3; ++t) {
      const auto& c = kt.tiers.tier[t];
      const metrics::Labels tier{{"tier", kTier[t]}};
      registry_.gauge("flashdllm_kv_tier_used_blocks", "KV blocks stored in the tier", tier)
          .set(double(c.used_blocks));
      registry_.gauge("flashdllm_kv_tier_capacity_blocks", "KV blocks the tier can hold", tier)
          .set(double(c.capacity_blocks));
      registry_.gauge("flashdllm_kv_tier_enabled", "1 when the tier is in use", tier)
          .set(c.enabled ? 1.0 : 0.0);
      mirror(registry_.counter("flashdllm_kv_tier_checksum_failures_total",
                               "Blocks from the tier that failed checksum verification", tier),
             double(c.checksum_failures), double(lt.tiers.tier[t].checksum_failures));
      for (size_t to = 0; to < 3; ++to) {
        if (to == t) continue;
        const metrics::Labels dir{{"from", kTier[t]}, {"to", kTier[to]}};
        mirror(registry_.counter("flashdllm_kv_blocks_moved_total", "KV blocks moved between tiers", dir),
               double(kt.tiers.blocks_moved[t][to]), double(lt.tiers.blocks_moved[t][to]));
        mirror(registry_.counter("flashdllm_kv_bytes_moved_total", "KV bytes moved between tiers", dir),
               double(kt.tiers.bytes_moved[t][to]), double(lt.tiers.bytes_moved[t][to]));
      }
    }
    mirror(counter("flashdllm_kv_cache_blocks_dropped_total",
                   "Evicted prefix-cache blocks released (recomputed if reused)"),
           double(kt.dropped), double(lt.dropped));
    mirror(counter("flashdllm_kv_cache_blocks_promoted_total",
                   "Offloaded prefix-cache blocks brought back into tier 0 on a hit"),
           double(kt.promoted), double(lt.promoted));
    mirror(counter("flashdllm_kv_prefetches_total", "Promotions started early for waiting requests"),
           double(kt.prefetches), double(lt.prefetches));
    // Device copies (GPU): the link's speed measured at start-up and what the copies moved,
    // in device time, per direction; the engine thread's waits for them.
    static const char* kDir[2] = {"h2d", "d2h"};
    const double link[2] = {kt.tiers.link_h2d_gbps, kt.tiers.link_d2h_gbps};
    const uint64_t bytes[2] = {kt.tiers.copy_h2d_bytes, kt.tiers.copy_d2h_bytes},
                   last_bytes[2] = {lt.tiers.copy_h2d_bytes, lt.tiers.copy_d2h_bytes};
    const double ms[2] = {kt.tiers.copy_h2d_ms, kt.tiers.copy_d2h_ms},
                 last_ms[2] = {lt.tiers.copy_h2d_ms, lt.tiers.copy_d2h_ms};
    for (int d = 0; d < 2; ++d) {
      const metrics::Labels dir{{"direction", kDir[d]}};
      registry_.gauge("flashdllm_kv_link_bytes_per_second",
                      "Host<->device link speed measured at start-up (one large page-locked transfer)", dir)
          .set(link[d] * 1e9);
      mirror(registry_.counter("flashdllm_kv_copy_bytes_total", "KV block bytes moved by device copies", dir),
             double(bytes[d]), double(last_bytes[d]));
      mirror(registry_.counter("flashdllm_kv_copy_device_seconds_total",
                               "Device time of KV block copies (their checksums included)", dir),
             ms[d] * 1e-3, last_ms[d] * 1e-3);
    }
    mirror(counter("flashdllm_kv_copy_waits_total", "Times the engine thread waited for a device copy"),
           double(kt.copy_waits), double(lt.copy_waits));
    mirror(counter("flashdllm_kv_copy_wait_seconds_total", "Engine-thread time spent waiting for device copies"),
           kt.copy_wait_ms_total * 1e-3, lt.copy_wait_ms_total * 1e-3);
    last_ = m;
  }
  return registry_.render();
}

}  // namespace fdl::server
