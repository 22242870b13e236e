// bench_stats.h — summary statistics for benchmark samples.
#pragma once

#include <vector>

namespace fdl::cli {

struct SampleSummary {
  double mean = 0;
  double stddev = 0;  ///< sample standard deviation (n - 1); 0 for fewer than 2 samples
  double median = 0;
  double p95 = 0;
  double min = 0;
  double max = 0;
};

/// Percentile with linear interpolation between closest ranks (the "R-7" rule NumPy uses
/// by default), q in [0, 100]. Throws std::invalid_argument for an empty sample.
double percentile(std::vector<double> samples, double q);

/// Mean, stddev, median, p95, min, max of `samples`. Throws for an empty sample.
SampleSummary summarize(const std::vector<double>& samples);

}  // namespace fdl::cli
