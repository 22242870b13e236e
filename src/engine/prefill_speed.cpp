// Prefill speed measurement (see prefill_speed.h).
#include "engine/prefill_speed.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace fdl::engine {

double measure_prefill_tok_per_s(Model& model, int block_size, int n_tokens) {
  const ModelConfig& cfg = model.config();
  const int n = std::max(1, std::min(n_tokens, cfg.n_ctx_train > 0 ? cfg.n_ctx_train : n_tokens));
  BlockPool pool(model.kv_shape(block_size), size_t((n + block_size - 1) / block_size));
  KvCache kv(pool);
  StepBatch batch;
  std::vector<float> logits;
  double best = 0;
  for (int run = 0; run < 4; ++run) {
    const SeqId seq = kv.create_sequence();
    kv.append_slots(seq, size_t(n));
    batch.clear();
    for (int i = 0; i < n; ++i)  // deterministic ids spread over the vocabulary
      batch.add(int32_t((i * 7919 + 1) % cfg.n_vocab), i, seq, i == n - 1);
    const auto t0 = std::chrono::steady_clock::now();
    model.forward(batch, kv, logits);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    kv.free_sequence(seq);
    if (run > 0 && s > 0) best = std::max(best, double(n) / s);  // the first run warms up
  }
  return best;
}

}  // namespace fdl::engine
