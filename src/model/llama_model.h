// llama_model.h — the Llama-family Model on the CPU: config + weight views + thread pool,
// with the forward orchestration in llama_forward.cpp.
#pragma once

#include <memory>

#include "backend/cpu/ops.h"
#include "backend/cpu/thread_pool.h"
#include "flashdllm/model.h"
#include "model/forward_scratch.h"
#include "model/llama_weights.h"
#include "model/token_tree.h"

namespace fdl {

class LlamaModel final : public Model {
 public:
  /// Takes ownership of the mapped file; throws ModelError for an invalid model.
  LlamaModel(GgufFile file, const ModelOptions& opt);

  const ModelConfig& config() const override { return config_; }
  const GgufFile& gguf() const override { return file_; }
  KvShape kv_shape(int block_size) const override;
  void forward(const StepBatch& batch, KvCache& kv, std::vector<float>& logits) override;
  int n_threads() const override { return threads_.size(); }
  bool supports_tree_verification() const override { return true; }

 private:
  /// Throws std::invalid_argument / std::out_of_range before anything is written; resolves
  /// the batch's token trees into tree_.
  void validate(const StepBatch& batch, const KvCache& kv);
  void run_layer(int layer, int64_t n_tokens, const StepBatch& batch, KvCache& kv);
  /// The mixture-of-experts FFN of the normed rows in scratch_.xn into scratch_.proj.
  void run_moe_ffn(const LlamaLayerWeights& w, int64_t n_tokens);

  GgufFile file_;
  ModelConfig config_;
  LlamaWeights weights_;
  cpu::RopeParams rope_;
  cpu::RopeParams rope_swa_;  ///< sliding layers' (ModelConfig::rope_freq_base_swa > 0)
  cpu::ThreadPool threads_;
  ForwardScratch scratch_;
  TokenTreeLayout tree_;  ///< KV slots and attention slot lists of the current batch
};

}  // namespace fdl
