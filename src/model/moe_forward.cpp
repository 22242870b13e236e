// The mixture-of-experts FFN on the CPU (ModelConfig::n_expert): route every token
// (moe_routing.h), run each expert once over the tokens routed to it, then sum each token's
// expert outputs in rank order. Each expert's matmuls are per row (matmul.h), and a token's sum
// runs over its own ranks only, so its output does not depend on the batch.
#include <algorithm>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "model/llama_model.h"
#include "model/moe_routing.h"

namespace fdl {

void LlamaModel::run_moe_ffn(const LlamaLayerWeights& w, int64_t n) {
  const ModelConfig& c = config_;
  ForwardScratch& s = scratch_;
  const int64_t d = c.n_embd, k = c.n_expert_used;
  cpu::matmul(threads_, w.router, s.xn.data(), n, s.router.data());
  for (int64_t t = 0; t < n; ++t)
    route_top_k(s.router.data() + t * c.n_expert, c.n_expert, int(k), s.route_ids.data() + t * k,
                s.route_w.data() + t * k);
  for (int e = 0; e < c.n_expert; ++e) {
    int64_t m = 0;  // tokens routed to e, each with the rank e holds for it
    for (int64_t i = 0; i < n * k; ++i)
      if (s.route_ids[size_t(i)] == e) {
        std::copy_n(s.xn.data() + (i / k) * d, d, s.moe_in.data() + m * d);
        s.moe_rows[size_t(m++)] = int32_t(i);
      }
    if (m == 0) continue;
    const ExpertWeights& x = w.experts[size_t(e)];
    const cpu::WeightMatrix* mats[] = {&x.gate, &x.up};
    float* outs[] = {s.gate.data(), s.up.data()};
    cpu::matmul_multi(threads_, mats, outs, 2, s.moe_in.data(), m, /*swiglu=*/true);  // gate = silu(gate) * up
    cpu::matmul(threads_, x.down, s.gate.data(), m, s.moe_in.data());
    for (int64_t r = 0; r < m; ++r)
      std::copy_n(s.moe_in.data() + r * d, d, s.moe_out.data() + int64_t(s.moe_rows[size_t(r)]) * d);
  }
  for (int64_t t = 0; t < n; ++t) {
    float* out = s.proj.data() + t * d;
    std::fill(out, out + d, 0.f);
    for (int64_t r = 0; r < k; ++r) {
      const float wr = s.route_w[size_t(t * k + r)];
      const float* y = s.moe_out.data() + (t * k + r) * d;
      for (int64_t i = 0; i < d; ++i) out[i] += wr * y[i];
    }
  }
}

}  // namespace fdl
