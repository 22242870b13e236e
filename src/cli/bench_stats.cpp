#include "cli/bench_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace fdl::cli {

double percentile(std::vector<double> samples, double q) {
  if (samples.empty()) throw std::invalid_argument("percentile of an empty sample");
  std::sort(samples.begin(), samples.end());
  const double rank = q / 100.0 * static_cast<double>(samples.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, samples.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return samples[lo] + (samples[hi] - samples[lo]) * frac;
}

SampleSummary summarize(const std::vector<double>& samples) {
  if (samples.empty()) throw std::invalid_argument("summary of an empty sample");
  SampleSummary s;
  const double n = static_cast<double>(samples.size());
  s.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / n;
  if (samples.size() > 1) {
    double sq = 0;
    for (const double x : samples) sq += (x - s.mean) * (x - s.mean);
    s.stddev = std::sqrt(sq / (n - 1));
  }
  s.median = percentile(samples, 50);
  s.p95 = percentile(samples, 95);
  const auto [mn, mx] = std::minmax_element(samples.begin(), samples.end());
  s.min = *mn;
  s.max = *mx;
  return s;
}

}  // namespace fdl::cli
