// Chrome trace-event writer (see step_trace.h).
#include "engine/step_trace.h"

#include <fstream>
#include <stdexcept>

namespace fdl::engine {
namespace {

const char* track_name(StepTrace::Track t) {
  switch (t) {
    case StepTrace::Track::Compute: return "compute";
    case StepTrace::Track::Copy: return "copy (tier 0 <-> 1)";
    case StepTrace::Track::Disk: return "disk io (tier 2)";
    case StepTrace::Track::Schedule: return "schedule (engine thread)";
  }
  return "?";
}

}  // namespace

StepTrace::StepTrace() : origin_(Clock::now()) {}

double StepTrace::us_since_origin(Clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - origin_).count();
}

void StepTrace::span(Track track, std::string name, Clock::time_point start, double dur_us,
                     nlohmann::json args) {
  events_.push_back({{"name", std::move(name)},
                     {"cat", track_name(track)},
                     {"ph", "X"},
                     {"pid", 1},
                     {"tid", int(track)},
                     {"ts", us_since_origin(start)},
                     {"dur", dur_us < 0 ? 0.0 : dur_us},
                     {"args", std::move(args)}});
}

void StepTrace::span_since(Track track, std::string name, Clock::time_point start, nlohmann::json args) {
  span(track, std::move(name), start, std::chrono::duration<double, std::micro>(Clock::now() - start).count(),
       std::move(args));
}

void StepTrace::span_ending_now(Track track, std::string name, double dur_us,
                                nlohmann::json args) {
  const auto end = Clock::now();
  const auto start = end - std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double, std::micro>(dur_us));
  span(track, std::move(name), start, dur_us, std::move(args));
}

void StepTrace::clear() {
  events_ = nlohmann::json::array();
  origin_ = Clock::now();
}

void StepTrace::write(const std::filesystem::path& file) const {
  nlohmann::json doc;
  nlohmann::json events = nlohmann::json::array();
  // Track names first, so viewers label the rows.
  for (Track t : {Track::Compute, Track::Copy, Track::Disk, Track::Schedule})
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", int(t)},
                      {"args", {{"name", track_name(t)}}}});
  for (const auto& e : events_) events.push_back(e);
  doc["traceEvents"] = std::move(events);
  doc["displayTimeUnit"] = "ms";
  std::ofstream out(file);
  if (!out) throw std::runtime_error("cannot write trace file '" + file.string() + "'");
  out << doc.dump() << '\n';
  if (!out) throw std::runtime_error("writing trace file '" + file.string() + "' failed");
}

}  // namespace fdl::engine
