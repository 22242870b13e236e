// route_top_k (moe_routing.h).
#include "model/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace fdl {

void route_top_k(const float* logits, int n_expert, int k, int32_t* ids, float* weights) {
  float mx = logits[0];
  for (int e = 1; e < n_expert; ++e) mx = std::max(mx, logits[e]);
  thread_local std::vector<float> p;  // grows to the largest expert count, then allocates nothing
  p.resize(size_t(n_expert));
  double sum = 0;
  // Each exponential in double, rounded once to fp32: correctly rounded (glibc's expf is not
  // always), which the CUDA router computes the same way.
  for (int e = 0; e < n_expert; ++e) sum += double(p[size_t(e)] = float(std::exp(double(logits[e] - mx))));
  for (int e = 0; e < n_expert; ++e) p[size_t(e)] = float(double(p[size_t(e)]) / sum);
  // Selection: the largest remaining probability, the lowest index among equals.
  for (int r = 0; r < k; ++r) {
    int best = -1;
    for (int e = 0; e < n_expert; ++e) {
      if (std::find(ids, ids + r, e) != ids + r) continue;
      if (best < 0 || p[size_t(e)] > p[size_t(best)]) best = e;
    }
    ids[r] = best;
  }
  double chosen = 0;
  for (int r = 0; r < k; ++r) chosen += double(p[size_t(ids[r])]);
  for (int r = 0; r < k; ++r) weights[r] = float(double(p[size_t(ids[r])]) / chosen);
}

}  // namespace fdl
