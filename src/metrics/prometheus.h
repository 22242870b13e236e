// prometheus.h — counters, gauges and histograms rendered in the Prometheus text exposition
// format 0.0.4, for the server's GET /metrics.
//
// Design: a Registry owns metric families (one name, one type, one help text, and for
// histograms one bucket layout); each family owns one child per distinct label set. Children
// live in node-based maps, so a reference returned by counter()/gauge()/histogram() stays
// valid for the Registry's whole lifetime: hot paths look a metric up once and keep the
// reference, then update it without touching the registry lock.
//
// Thread-safety: every method of every class here may be called from any thread at any time.
// Counter and Gauge updates are lock-free atomics; Histogram::observe takes a short per-
// histogram mutex (so a snapshot is consistent: sum, count and buckets agree); Registry
// lookups and render() take the registry mutex.
//
// Units: the library is unit-agnostic; put the unit in the metric name as Prometheus asks
// (e.g. `..._ms`, `..._seconds`, `..._total` for counters).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace fdl::metrics {

/// Label name/value pairs. Order given by the caller does not matter: label sets are
/// compared and rendered sorted by name. Duplicate names throw std::invalid_argument.
using Labels = std::vector<std::pair<std::string, std::string>>;

/// Monotonically increasing value (requests served, tokens generated).
class Counter {
 public:
  /// Adds v. Throws std::invalid_argument if v < 0, NaN or infinite (a counter never goes
  /// down, and +Inf would poison it forever).
  void inc(double v = 1.0);
  double value() const;

 private:
  std::atomic<double> value_{0.0};
};

/// Value that goes up and down (running requests, KV blocks in use).
class Gauge {
 public:
  void set(double v);
  void add(double v);  ///< v may be negative
  double value() const;

 private:
  std::atomic<double> value_{0.0};
};

/// Distribution of observed values in fixed buckets (latencies).
class Histogram {
 public:
  /// upper_bounds: inclusive bucket upper bounds (a value v lands in the first bucket with
  /// v <= bound), strictly increasing and finite; the +Inf bucket is implicit. An empty list
  /// is allowed (only +Inf). Throws std::invalid_argument otherwise.
  explicit Histogram(std::vector<double> upper_bounds);

  /// Records v. NaN is ignored (it has no bucket and would poison the sum); ±Inf are counted
  /// (+Inf in the +Inf bucket, -Inf in the first).
  void observe(double v);

  struct Snapshot {
    std::vector<double> upper_bounds;  ///< finite bounds, as given to the constructor
    std::vector<uint64_t> cumulative;  ///< size upper_bounds.size() + 1; last is +Inf == count
    double sum = 0;
    uint64_t count = 0;
    /// Estimated q-quantile (0 <= q <= 1) by linear interpolation inside the bucket, as
    /// Prometheus' histogram_quantile does: the first bucket interpolates from 0 (or from its
    /// bound if that is negative), a quantile in the +Inf bucket returns the highest finite
    /// bound. Returns NaN when count == 0. Throws std::invalid_argument for q outside [0, 1]
    /// or NaN.
    double quantile(double q) const;
  };
  Snapshot snapshot() const;

  const std::vector<double>& upper_bounds() const { return bounds_; }

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), size bounds_.size() + 1
  double sum_ = 0;
  uint64_t count_ = 0;
};

/// Owns metric families and renders them. Non-copyable, non-movable (references escape).
class Registry {
 public:
  Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;
  ~Registry();

  // Families are created on first use; asking again with the same name and labels returns the
  // same object. The help text of the first call wins.
  // Throws std::invalid_argument for an invalid metric name ([a-zA-Z_:][a-zA-Z0-9_:]*), an
  // invalid label name ([a-zA-Z_][a-zA-Z0-9_]*, not starting with "__", not "le" for
  // histograms), duplicate label names, a name reused with another type or other buckets, or
  // a histogram name whose _bucket/_sum/_count suffix collides with another family.
  Counter& counter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& gauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& histogram(const std::string& name, const std::string& help,
                       const std::vector<double>& upper_bounds, const Labels& labels = {});

  /// Prometheus text exposition format 0.0.4 (Content-Type
  /// "text/plain; version=0.0.4; charset=utf-8"): families sorted by name, each with one
  /// # HELP and one # TYPE line, then one sample per child (histograms: cumulative
  /// `_bucket{le="..."}` lines ending with le="+Inf", then `_sum` and `_count`). Help text
  /// escapes `\` and newline; label values escape `\`, `"` and newline. Ends with "\n".
  std::string render() const;

 private:
  struct Family;
  Family& family(const std::string& name, const std::string& help, int type,
                 const std::vector<double>* bounds);
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Family>> families_;
};

/// Content-Type header value for render()'s output.
inline constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

/// Default buckets for TTFT / inter-token latency / end-to-end latency in milliseconds:
/// 0.5 ms .. 60 000 ms, roughly 1-2.5-5 per decade.
std::vector<double> latency_buckets_ms();

/// Formats a double the way Prometheus expects: "+Inf", "-Inf", "NaN", integers without an
/// exponent where exact, otherwise the shortest round-trip representation.
std::string format_value(double v);

}  // namespace fdl::metrics
