// Internal: a per-step Chrome trace (trace-event JSON, "X" complete events; Perfetto and
// chrome://tracing open it). One process, four tracks: compute (forward passes), copy (tier
// 0 <-> tier 1 copies), disk (tier-2 reads/writes, drawn from submission to completion) and
// schedule (the engine thread's own work between forwards: planning, admission, prefetch,
// emitting tokens).
//
// Units: microseconds since the trace was created. Memory: one small JSON object per event;
// the scheduler records a handful per step, so a long run should not keep tracing on.
// Errors: write() throws std::runtime_error when the file cannot be written.
// Thread-safety: none; the engine thread records, the owner writes after the run.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace fdl::engine {

class StepTrace {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Track : int { Compute = 1, Copy = 2, Disk = 3, Schedule = 4 };

  StepTrace();
  /// A span that started at `start` and lasted `dur_us`; `args` shows in the detail pane.
  void span(Track track, std::string name, Clock::time_point start, double dur_us,
            nlohmann::json args = nlohmann::json::object());
  /// A span from `start` to now (work the engine thread just did).
  void span_since(Track track, std::string name, Clock::time_point start,
                  nlohmann::json args = nlohmann::json::object());
  /// A span that ended now and lasted `dur_us` (asynchronous transfers reported on completion).
  void span_ending_now(Track track, std::string name, double dur_us,
                       nlohmann::json args = nlohmann::json::object());
  size_t size() const { return events_.size(); }
  void clear();
  /// Writes {"traceEvents": [...], "displayTimeUnit": "ms"} to `file`.
  void write(const std::filesystem::path& file) const;

 private:
  double us_since_origin(Clock::time_point t) const;
  Clock::time_point origin_;
  nlohmann::json events_ = nlohmann::json::array();
};

}  // namespace fdl::engine
