// The LlamaModel constructor: map the file, read the config, bind weights.
#include "model/llama_model.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashdllm/sampling.h"
#include "model/weight_panels.h"

namespace fdl {

LlamaModel::LlamaModel(GgufFile file, const ModelOptions& opt)
    : file_(std::move(file)),
      config_(ModelConfig::from_gguf(file_)),
      weights_(bind_llama_weights(file_, config_)),
      threads_(opt.n_threads) {
  prepare_weight_panels(weights_, file_, threads_);
  rope_ = global_rope_params(config_, weights_, opt.n_ctx);
  rope_swa_.head_dim = config_.head_dim;
  rope_swa_.rope_dim = config_.rope_dim;
  rope_swa_.freq_base = config_.rope_freq_base_swa;  // unscaled
}

KvShape LlamaModel::kv_shape(int block_size) const {
  if (block_size <= 0)
    throw std::invalid_argument("kv_shape: block size must be positive, got " + std::to_string(block_size));
  return KvShape{.n_layer = config_.n_layer,
                 .n_kv_head = config_.n_head_kv,
                 .head_dim = config_.head_dim,
                 .block_size = block_size};
}

void Model::forward_argmax(const StepBatch& batch, KvCache& kv, std::vector<int32_t>& ids) {
  std::vector<float> logits;
  forward(batch, kv, logits);
  const size_t V = size_t(config().n_vocab);
  ids.resize(V > 0 ? logits.size() / V : 0);
  for (size_t r = 0; r < ids.size(); ++r) {
    const float* row = logits.data() + r * V;
    ids[r] = int32_t(std::max_element(row, row + V) - row);  // the first maximum: lowest id
  }
}

namespace {

void check_token_masks(const TokenMasks& masks, size_t m, int32_t n_vocab) {
  if (masks.which.size() != masks.rows.size())
    throw std::invalid_argument("forward_sample: " + std::to_string(masks.rows.size()) + " masked rows but " +
                                std::to_string(masks.which.size()) + " mask indices");
  const size_t wpr = TokenMasks::words_per_row(n_vocab);
  if (masks.words.size() % wpr != 0)
    throw std::invalid_argument("forward_sample: " + std::to_string(masks.words.size()) +
                                " mask words are not whole masks of " + std::to_string(wpr));
  const size_t n_masks = masks.words.size() / wpr;
  thread_local std::vector<bool> seen;  // every masked step checks: no allocation per step
  seen.assign(m, false);
  for (size_t i = 0; i < masks.rows.size(); ++i) {
    const int32_t r = masks.rows[i], w = masks.which[i];
    if (r < 0 || size_t(r) >= m || seen[size_t(r)])
      throw std::invalid_argument("forward_sample: masked row " + std::to_string(r) + " outside the step's " +
                                  std::to_string(m) + " rows or masked twice");
    if (w < 0 || size_t(w) >= n_masks)
      throw std::invalid_argument("forward_sample: mask " + std::to_string(w) + " of row " + std::to_string(r) +
                                  " outside the " + std::to_string(n_masks) + " given");
    seen[size_t(r)] = true;
  }
}

}  // namespace

void check_sampling_rows(const StepBatch& batch, std::span<const RowSampling> rows,
                         std::span<const PenaltyToken> penalties, int32_t n_vocab, const TokenMasks& masks) {
  const size_t m = batch.n_wanted();
  if (rows.size() != m)
    throw std::invalid_argument("forward_sample: " + std::to_string(rows.size()) + " sampling rows for " +
                                std::to_string(m) + " tokens that want logits");
  for (const RowSampling& r : rows) Sampler::params_of(r);  // what the sampler refuses
  for (const PenaltyToken& p : penalties)
    if (p.row < 0 || size_t(p.row) >= m || p.token < 0 || p.token >= n_vocab || p.count < 1)
      throw std::invalid_argument("forward_sample: penalty token (row " + std::to_string(p.row) + ", token " +
                                  std::to_string(p.token) + ", count " + std::to_string(p.count) +
                                  ") outside " + std::to_string(m) + " rows, " + std::to_string(n_vocab) +
                                  " tokens or counts >= 1");
  // One entry per distinct (row, token), its count the occurrences: a repeated entry would be
  // penalized twice on the host and, on the GPU, by two threads updating one logit at once.
  if (penalties.size() > 1) {
    thread_local std::vector<uint64_t> keys;  // every penalized step checks: no allocation per step
    keys.clear();
    for (const PenaltyToken& p : penalties) keys.push_back(uint64_t(uint32_t(p.row)) << 32 | uint32_t(p.token));
    std::sort(keys.begin(), keys.end());
    if (const auto it = std::adjacent_find(keys.begin(), keys.end()); it != keys.end())
      throw std::invalid_argument("forward_sample: penalty token (row " + std::to_string(*it >> 32) + ", token " +
                                  std::to_string(uint32_t(*it)) +
                                  ") listed twice (give each distinct token once, with its count)");
  }
  check_token_masks(masks, m, n_vocab);
}

void Model::forward_sample(const StepBatch& batch, KvCache& kv, std::span<const RowSampling> rows,
                           std::span<const PenaltyToken> penalties, std::vector<int32_t>& ids,
                           const TokenMasks& masks) {
  const int32_t V = config().n_vocab;
  check_sampling_rows(batch, rows, penalties, V, masks);
  std::vector<float> logits;
  forward(batch, kv, logits);
  const size_t wpr = TokenMasks::words_per_row(V);
  for (size_t i = 0; i < masks.rows.size(); ++i) {  // the grammar's -inf first, as the device does
    const uint64_t* bits = masks.words.data() + size_t(masks.which[i]) * wpr;
    float* row = logits.data() + size_t(masks.rows[i]) * size_t(V);
    for (int32_t t = 0; t < V; ++t)
      if (!((bits[size_t(t) / 64] >> (size_t(t) % 64)) & 1u)) row[t] = -std::numeric_limits<float>::infinity();
  }
  for (const PenaltyToken& p : penalties) {  // stage 1, as the sampler would apply it
    const RowSampling& r = rows[size_t(p.row)];
    float& logit = logits[size_t(p.row) * size_t(V) + size_t(p.token)];
    logit = penalize_logit(logit, p.count, r.repeat_penalty, r.frequency_penalty, r.presence_penalty);
  }
  ids.resize(rows.size());
  for (size_t r = 0; r < ids.size(); ++r) {
    SamplingParams sp = Sampler::params_of(rows[r]);
    sp.repeat_penalty = 1.0f;  // applied above; this sampler has no history anyway
    sp.frequency_penalty = sp.presence_penalty = 0.0f;
    Sampler sampler(sp, V);
    ids[r] = sampler.sample_with_uniform({logits.data() + r * size_t(V), size_t(V)}, rows[r].uniform);
  }
}

void Model::note_plain_forward(const char* what) {
  DefaultPipeline& p = default_pipeline_;
  if (p.in_submit) return;
  if (!p.queued.empty())
    throw std::logic_error(std::string(what) + ": " + std::to_string(p.queued.size()) +
                           " submitted step(s) not collected yet (collect_ids first)");
  p.chain_rows = -1;
}

void Model::submit_sample(const StepBatch& batch, KvCache& kv, std::span<const RowSampling> rows,
                          std::span<const PenaltyToken> penalties) {
  DefaultPipeline& p = default_pipeline_;
  if (p.queued.size() >= kMaxSubmitted)
    throw std::logic_error("submit_sample: " + std::to_string(p.queued.size()) +
                           " steps already submitted and not collected (at most " + std::to_string(kMaxSubmitted) + ")");
  check_sampling_rows(batch, rows, penalties, config().n_vocab);  // a refused step leaves the chain as it was
  // The previous step's ids are known here (it ran inside its submit): substitute them.
  StepBatch resolved = batch;
  for (size_t i = 0; i < resolved.tokens.size(); ++i) {
    int32_t& t = resolved.tokens[i];
    if (t >= 0) continue;
    if (p.chain_rows < 0)
      throw std::invalid_argument("submit_sample: token " + std::to_string(i) +
                                  " refers to the previous step's ids, but no submit_sample step ran since the "
                                  "last other forward");
    const int32_t row = previous_step_row(t);
    if (row >= p.chain_rows)
      throw std::out_of_range("submit_sample: token " + std::to_string(i) + " refers to row " + std::to_string(row) +
                              " of a previous step with " + std::to_string(p.chain_rows) + " rows");
    t = p.last_ids[size_t(row)];
  }
  std::vector<int32_t> ids;
  p.in_submit = true;
  try {
    forward_sample(resolved, kv, rows, penalties, ids);
  } catch (...) {
    p.in_submit = false;
    p.chain_rows = -1;
    throw;
  }
  p.in_submit = false;
  p.last_ids = ids;
  p.chain_rows = long(ids.size());
  p.queued.push_back(std::move(ids));
}

void Model::collect_ids(std::vector<int32_t>& ids) {
  DefaultPipeline& p = default_pipeline_;
  if (p.queued.empty()) throw std::logic_error("collect_ids: no submitted step to collect");
  ids = std::move(p.queued.front());
  p.queued.erase(p.queued.begin());
}

std::optional<KvDtype> parse_kv_dtype(const std::string& s) {
  if (s == "auto") return std::nullopt;
  if (s == "f32" || s == "fp32" || s == "float32") return KvDtype::F32;
  if (s == "f16" || s == "fp16" || s == "float16" || s == "half") return KvDtype::F16;
  if (s == "bf16" || s == "bfloat16") return KvDtype::BF16;
  throw std::invalid_argument("--kv-cache-dtype: expected auto, f32, f16 or bf16, got '" + s + "'");
}

}  // namespace fdl
