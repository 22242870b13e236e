// Test helper: Pearson's chi-square test of homogeneity for two samples of categories
// (is the distribution behind `a` the same as behind `b`?), with its p-value.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <vector>

namespace fdl::test {

/// Q(s, x) = Gamma(s, x) / Gamma(s), the upper regularized incomplete gamma function: a
/// series for x < s + 1, a continued fraction (modified Lentz) otherwise.
inline double gamma_q(double s, double x) {
  if (x <= 0) return 1.0;
  const double log_prefix = s * std::log(x) - x - std::lgamma(s);
  if (x < s + 1) {
    double term = 1.0 / s, sum = term;
    for (int n = 1; n < 10000 && std::fabs(term) > 1e-15 * std::fabs(sum); ++n) {
      term *= x / (s + n);
      sum += term;
    }
    return 1.0 - sum * std::exp(log_prefix);
  }
  const double tiny = 1e-300;
  double b = x + 1 - s, c = 1 / tiny, d = 1 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - s);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1) < 1e-15) break;
  }
  return std::exp(log_prefix) * h;
}

struct ChiSquare {
  double statistic = 0;
  int dof = 0;
  double p_value = 1;
};

/// Categories with fewer than `min_count` observations in both samples together are pooled
/// into one (so every expected count is large enough for the chi-square approximation).
template <class Key>
ChiSquare chi_square_two_samples(const std::map<Key, int64_t>& a, const std::map<Key, int64_t>& b,
                                 int64_t min_count = 20) {
  std::map<Key, std::pair<double, double>> joint;
  for (const auto& [k, n] : a) joint[k].first += double(n);
  for (const auto& [k, n] : b) joint[k].second += double(n);
  std::vector<std::pair<double, double>> cells;
  std::pair<double, double> pooled{0, 0};
  for (const auto& [k, c] : joint) {
    if (c.first + c.second >= double(min_count)) cells.push_back(c);
    else { pooled.first += c.first; pooled.second += c.second; }
  }
  if (pooled.first + pooled.second > 0) cells.push_back(pooled);
  double na = 0, nb = 0;
  for (const auto& c : cells) { na += c.first; nb += c.second; }
  if (na == 0 || nb == 0 || cells.size() < 2) throw std::invalid_argument("chi-square: degenerate samples");
  ChiSquare r;
  const double n = na + nb;
  for (const auto& c : cells) {
    const double total = c.first + c.second;
    const double ea = total * na / n, eb = total * nb / n;
    r.statistic += (c.first - ea) * (c.first - ea) / ea + (c.second - eb) * (c.second - eb) / eb;
  }
  r.dof = int(cells.size()) - 1;
  r.p_value = gamma_q(r.dof / 2.0, r.statistic / 2.0);
  return r;
}

/// Goodness of fit of observed counts to exact probabilities: categories whose expected
/// count is below `min_expected` are pooled into one (with the unobserved mass).
template <class Key>
ChiSquare chi_square_fit(const std::map<Key, int64_t>& observed, const std::map<Key, double>& probs,
                         double min_expected = 5.0) {
  double n = 0;
  for (const auto& [k, c] : observed) n += double(c);
  ChiSquare r;
  double pooled_e = 0, pooled_o = 0, seen_p = 0;
  int cells = 0;
  for (const auto& [k, p] : probs) {
    seen_p += p;
    const auto it = observed.find(k);
    const double o = it == observed.end() ? 0.0 : double(it->second);
    const double e = p * n;
    if (e < min_expected) { pooled_e += e; pooled_o += o; continue; }
    r.statistic += (o - e) * (o - e) / e;
    ++cells;
  }
  // Observations outside `probs` (probability 0 there) belong to the pooled cell too.
  for (const auto& [k, c] : observed)
    if (!probs.count(k)) pooled_o += double(c);
  pooled_e += std::max(0.0, 1.0 - seen_p) * n;
  if (pooled_e > 0) {
    r.statistic += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++cells;
  } else if (pooled_o > 0) {
    r.statistic = INFINITY;  // drew something impossible
  }
  r.dof = cells - 1;
  r.p_value = std::isinf(r.statistic) ? 0.0 : gamma_q(r.dof / 2.0, r.statistic / 2.0);
  return r;
}

}  // namespace fdl::test
