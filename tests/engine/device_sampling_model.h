// A real (CPU) model wrapped to prefer sampling on its device, as the CUDA model does: the
// scheduler then takes the ids-only path (Model::forward_sample) and pipelines steps
// (Model::submit_sample; Model's defaults run them at once). Counts which path each step took.
#pragma once

#include <span>
#include <stdexcept>
#include <vector>

#include "flashdllm/model.h"

namespace fdl::test {

class ArgmaxPreferringModel final : public Model {
 public:
  explicit ArgmaxPreferringModel(Model& inner) : inner_(inner) {}
  const ModelConfig& config() const override { return inner_.config(); }
  const GgufFile& gguf() const override { return inner_.gguf(); }
  KvShape kv_shape(int block_size) const override { return inner_.kv_shape(block_size); }
  int n_threads() const override { return inner_.n_threads(); }
  void forward(const StepBatch& b, KvCache& kv, std::vector<float>& logits) override {
    fail_if_asked();
    ++logit_steps;
    inner_.forward(b, kv, logits);
  }
  void forward_sample(const StepBatch& b, KvCache& kv, std::span<const RowSampling> rows,
                      std::span<const PenaltyToken> penalties, std::vector<int32_t>& ids,
                      const TokenMasks& masks = {}) override {
    fail_if_asked();
    ++ids_steps;
    for (const RowSampling& r : rows) sampled_rows += r.temperature > 0.0f ? 1 : 0;
    penalty_tokens += int(penalties.size());
    masked_rows += int(masks.rows.size());
    inner_.forward_sample(b, kv, rows, penalties, ids, masks);  // Model's default: forward + host sampling
  }
  void submit_sample(const StepBatch& b, KvCache& kv, std::span<const RowSampling> rows,
                     std::span<const PenaltyToken> penalties) override {
    ++submits;
    for (const int32_t t : b.tokens) chained_tokens += t < 0 ? 1 : 0;
    Model::submit_sample(b, kv, rows, penalties);  // runs forward_sample above at once
  }
  // fail_next_collect: the next collect_ids throws as a step with a NaN row would.
  void collect_ids(std::vector<int32_t>& ids) override {
    Model::collect_ids(ids);
    if (fail_next_collect) {
      fail_next_collect = false;
      throw std::invalid_argument("collect_ids: logits row 0 holds NaN or +Inf, or only -Inf: nothing to sample");
    }
  }
  bool fail_next_collect = false;
  // fail_next_forward: the next forward throws before computing anything, as a step that
  // fails its checks does.
  bool fail_next_forward = false;
  void fail_if_asked() {
    if (!fail_next_forward) return;
    fail_next_forward = false;
    throw std::runtime_error("forward: injected failure");
  }
  bool prefers_device_sampling() const override { return true; }
  int logit_steps = 0, ids_steps = 0, sampled_rows = 0, penalty_tokens = 0, masked_rows = 0, submits = 0,
      chained_tokens = 0;

 private:
  Model& inner_;
};

}  // namespace fdl::test
