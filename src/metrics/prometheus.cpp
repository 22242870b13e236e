// prometheus.cpp — metric primitives, the registry and the text exposition renderer.
#include "metrics/prometheus.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace fdl::metrics {

// ---- Counter / Gauge -------------------------------------------------------------------

void Counter::inc(double v) {
  if (!(v >= 0.0) || std::isinf(v))  // also catches NaN
    throw std::invalid_argument("Counter::inc: increment must be finite and >= 0, got " +
                                format_value(v));
  value_.fetch_add(v, std::memory_order_relaxed);
}

double Counter::value() const { return value_.load(std::memory_order_relaxed); }

void Gauge::set(double v) { value_.store(v, std::memory_order_relaxed); }
void Gauge::add(double v) { value_.fetch_add(v, std::memory_order_relaxed); }
double Gauge::value() const { return value_.load(std::memory_order_relaxed); }

// ---- Histogram -------------------------------------------------------------------------

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]))
      throw std::invalid_argument("Histogram: bucket bound " + std::to_string(i) +
                                  " is not finite (+Inf is implicit)");
    if (i > 0 && !(bounds_[i] > bounds_[i - 1]))
      throw std::invalid_argument("Histogram: bucket bounds must be strictly increasing, got " +
                                  format_value(bounds_[i - 1]) + " then " +
                                  format_value(bounds_[i]));
  }
  counts_.assign(bounds_.size() + 1, 0);
}

void Histogram::observe(double v) {
  if (std::isnan(v)) return;
  // First bound >= v: Prometheus buckets are inclusive upper bounds (le = "less or equal").
  size_t idx = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[idx];
  sum_ += v;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.upper_bounds = bounds_;
  std::lock_guard<std::mutex> lock(mu_);
  s.cumulative.resize(counts_.size());
  uint64_t acc = 0;
  for (size_t i = 0; i < counts_.size(); ++i) s.cumulative[i] = acc += counts_[i];
  s.sum = sum_;
  s.count = count_;
  return s;
}

double Histogram::Snapshot::quantile(double q) const {
  if (!(q >= 0.0 && q <= 1.0))
    throw std::invalid_argument("Histogram::Snapshot::quantile: q must be in [0, 1], got " +
                                format_value(q));
  if (count == 0 || cumulative.empty()) return std::numeric_limits<double>::quiet_NaN();
  const double rank = q * static_cast<double>(count);
  // First bucket whose cumulative count reaches the rank.
  size_t b = 0;
  while (b + 1 < cumulative.size() && static_cast<double>(cumulative[b]) < rank) ++b;
  if (b == upper_bounds.size()) {
    // +Inf bucket: no upper edge to interpolate to; report the highest finite bound.
    return upper_bounds.empty() ? std::numeric_limits<double>::infinity() : upper_bounds.back();
  }
  const double hi = upper_bounds[b];
  const double lo = b == 0 ? std::min(0.0, hi) : upper_bounds[b - 1];
  const double below = b == 0 ? 0.0 : static_cast<double>(cumulative[b - 1]);
  const double in_bucket = static_cast<double>(cumulative[b]) - below;
  if (in_bucket <= 0) return hi;
  return lo + (hi - lo) * (rank - below) / in_bucket;
}

// ---- Names and escaping ----------------------------------------------------------------

namespace {

enum Type { kCounter = 0, kGauge = 1, kHistogram = 2 };
const char* type_name(int t) {
  return t == kCounter ? "counter" : t == kGauge ? "gauge" : "histogram";
}

bool is_alpha_(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

void check_metric_name(const std::string& n) {
  bool ok = !n.empty() && (is_alpha_(n[0]) || n[0] == ':');
  for (size_t i = 1; ok && i < n.size(); ++i) ok = is_alpha_(n[i]) || is_digit(n[i]) || n[i] == ':';
  if (!ok)
    throw std::invalid_argument("metrics: invalid metric name '" + n +
                                "' (must match [a-zA-Z_:][a-zA-Z0-9_:]*)");
}

// Returns the labels sorted by name after validating them, so {a,b} and {b,a} are one child.
Labels check_labels(const std::string& metric, Labels labels, bool histogram) {
  for (const auto& [k, v] : labels) {
    bool ok = !k.empty() && is_alpha_(k[0]);
    for (size_t i = 1; ok && i < k.size(); ++i) ok = is_alpha_(k[i]) || is_digit(k[i]);
    if (!ok)
      throw std::invalid_argument("metrics: invalid label name '" + k + "' on '" + metric +
                                  "' (must match [a-zA-Z_][a-zA-Z0-9_]*)");
    if (k.rfind("__", 0) == 0)
      throw std::invalid_argument("metrics: label name '" + k + "' on '" + metric +
                                  "' is reserved (starts with __)");
    if (histogram && k == "le")
      throw std::invalid_argument("metrics: label name 'le' is reserved for histogram '" +
                                  metric + "'");
  }
  std::sort(labels.begin(), labels.end());
  for (size_t i = 1; i < labels.size(); ++i)
    if (labels[i].first == labels[i - 1].first)
      throw std::invalid_argument("metrics: duplicate label name '" + labels[i].first +
                                  "' on '" + metric + "'");
  return labels;
}

std::string escape_help(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    if (c == '\\') o += "\\\\";
    else if (c == '\n') o += "\\n";
    else o += c;
  }
  return o;
}

std::string escape_label_value(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    if (c == '\\') o += "\\\\";
    else if (c == '"') o += "\\\"";
    else if (c == '\n') o += "\\n";
    else o += c;
  }
  return o;
}

// {a="x",b="y"} plus an optional extra label (le) appended last; empty string if no labels.
std::string label_block(const Labels& labels, const char* extra_key = nullptr,
                        const std::string& extra_val = {}) {
  if (labels.empty() && extra_key == nullptr) return {};
  std::string o = "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) o += ',';
    first = false;
    o += k + "=\"" + escape_label_value(v) + '"';
  }
  if (extra_key != nullptr) {
    if (!first) o += ',';
    o += std::string(extra_key) + "=\"" + escape_label_value(extra_val) + '"';
  }
  return o + "}";
}

}  // namespace

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Integers up to 2^53 print exactly without exponent: counters read naturally ("42").
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) {
    char buf[32];
    auto r = std::to_chars(buf, buf + sizeof buf, static_cast<int64_t>(v));
    return std::string(buf, r.ptr);
  }
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form
  return std::string(buf, r.ptr);
}

// ---- Registry --------------------------------------------------------------------------

struct Registry::Family {
  std::string help;
  int type = kCounter;
  std::vector<double> bounds;  // histograms only
  // Children keyed by sorted labels; std::map nodes never move, so references are stable.
  std::map<Labels, std::unique_ptr<Counter>> counters;
  std::map<Labels, std::unique_ptr<Gauge>> gauges;
  std::map<Labels, std::unique_ptr<Histogram>> histograms;
};

Registry::Registry() = default;
Registry::~Registry() = default;

Registry::Family& Registry::family(const std::string& name, const std::string& help, int type,
                                   const std::vector<double>* bounds) {
  // Caller holds mu_.
  check_metric_name(name);
  auto it = families_.find(name);
  if (it != families_.end()) {
    Family& f = *it->second;
    if (f.type != type)
      throw std::invalid_argument("metrics: '" + name + "' is already registered as a " +
                                  type_name(f.type) + ", not a " + type_name(type));
    if (bounds != nullptr && f.bounds != *bounds)
      throw std::invalid_argument("metrics: histogram '" + name +
                                  "' is already registered with other buckets");
    return f;
  }
  // A histogram renders name_bucket/_sum/_count: those must not clash with other families,
  // or the exposition would have two TYPE lines for one sample name.
  auto clash = [&](const std::string& other) {
    if (families_.count(other) != 0)
      throw std::invalid_argument("metrics: '" + name + "' collides with existing metric '" +
                                  other + "' (histogram suffixes _bucket/_sum/_count)");
  };
  if (type == kHistogram) {
    for (const char* s : {"_bucket", "_sum", "_count"}) clash(name + s);
  }
  for (const auto& [other, fam] : families_) {
    if (fam->type != kHistogram) continue;
    for (const char* s : {"_bucket", "_sum", "_count"})
      if (name == other + s) clash(other);
  }
  if (bounds != nullptr) Histogram probe(*bounds);  // validates bounds before registering
  auto f = std::make_unique<Family>();
  f->help = help;
  f->type = type;
  if (bounds != nullptr) f->bounds = *bounds;
  return *families_.emplace(name, std::move(f)).first->second;
}

Counter& Registry::counter(const std::string& name, const std::string& help,
                           const Labels& labels) {
  Labels sorted = check_labels(name, labels, false);
  std::lock_guard<std::mutex> lock(mu_);
  Family& f = family(name, help, kCounter, nullptr);
  auto& slot = f.counters[sorted];
  if (!slot) slot = std::make_unique<Counter>();
  return *slot;
}

Gauge& Registry::gauge(const std::string& name, const std::string& help, const Labels& labels) {
  Labels sorted = check_labels(name, labels, false);
  std::lock_guard<std::mutex> lock(mu_);
  Family& f = family(name, help, kGauge, nullptr);
  auto& slot = f.gauges[sorted];
  if (!slot) slot = std::make_unique<Gauge>();
  return *slot;
}

Histogram& Registry::histogram(const std::string& name, const std::string& help,
                               const std::vector<double>& upper_bounds, const Labels& labels) {
  Labels sorted = check_labels(name, labels, true);
  std::lock_guard<std::mutex> lock(mu_);
  Family& f = family(name, help, kHistogram, &upper_bounds);
  auto& slot = f.histograms[sorted];
  if (!slot) slot = std::make_unique<Histogram>(upper_bounds);
  return *slot;
}

std::string Registry::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string o;
  for (const auto& [name, f] : families_) {
    o += "# HELP " + name + ' ' + escape_help(f->help) + '\n';
    o += "# TYPE " + name + ' ' + type_name(f->type) + '\n';
    for (const auto& [labels, c] : f->counters)
      o += name + label_block(labels) + ' ' + format_value(c->value()) + '\n';
    for (const auto& [labels, g] : f->gauges)
      o += name + label_block(labels) + ' ' + format_value(g->value()) + '\n';
    for (const auto& [labels, h] : f->histograms) {
      const Histogram::Snapshot s = h->snapshot();
      for (size_t i = 0; i < s.cumulative.size(); ++i) {
        const std::string le = i < s.upper_bounds.size() ? format_value(s.upper_bounds[i]) : "+Inf";
        o += name + "_bucket" + label_block(labels, "le", le) + ' ' +
             format_value(static_cast<double>(s.cumulative[i])) + '\n';
      }
      o += name + "_sum" + label_block(labels) + ' ' + format_value(s.sum) + '\n';
      o += name + "_count" + label_block(labels) + ' ' +
           format_value(static_cast<double>(s.count)) + '\n';
    }
  }
  return o;
}

std::vector<double> latency_buckets_ms() {
  return {0.5,  1,    2.5,  5,     10,    25,    50,    75,    100,   150,   250,
          500,  750,  1000, 2500,  5000,  10000, 20000, 30000, 60000};
}

}  // namespace fdl::metrics
