// Internal: the counters the scheduler keeps (EngineMetrics mirrors them). Plain data, owned
// by the Scheduler; the OutputProcessor counts generated and finished requests into them.
#pragma once

#include <cstdint>

namespace fdl::engine {

struct SchedulerCounters {
  int64_t steps = 0;
  int64_t submitted = 0;
  int64_t finished = 0;
  int64_t aborted = 0;
  int64_t failed = 0;
  int64_t preemptions = 0;
  int64_t prompt_tokens = 0;
  int64_t prefill_computed = 0;
  int64_t recomputed = 0;
  int64_t generated = 0;
  int64_t prefix_queries = 0;
  int64_t prefix_hits = 0;
};

}  // namespace fdl::engine
