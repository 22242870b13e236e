// CudaModel: load, batch checks, per-step input packing and upload, and the step launch
// (design in cuda_model.h); the kernels are the LayerRunner's (layer_runner.h).
#include "backend/cuda/cuda_model.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include <spdlog/spdlog.h>

#include "backend/cuda/moe.h"
#include "flashdllm/sampling.h"
#include "model/step_batch_check.h"

namespace fdl::cuda {

namespace {
/// Offsets (in int32 words) of the packed per-step inputs; fixed for a given (n, m), so the
/// device pointers a captured graph holds stay valid across steps of the same shape. The RoPE
/// rows start on 16 bytes: the invariant batch-1 attention block copies its token's row into
/// shared memory with 16-byte cp.async before the PDL wait.
struct Layout {
  size_t tokens, positions, dst_block, table_off, row_idx, cos_sin, cos_sin_swa, tables;
  /// `swa`: the sliding layers rotate with a RoPE of their own (a second cos/sin table).
  Layout(int n, int m, int rope_dim, bool swa)
      : tokens(0), positions(size_t(n)), dst_block(2 * size_t(n)), table_off(3 * size_t(n)),
        row_idx(4 * size_t(n)), cos_sin((4 * size_t(n) + size_t(m) + 3) / 4 * 4),
        cos_sin_swa(cos_sin + size_t(n) * size_t(rope_dim)),
        tables(cos_sin_swa + (swa ? size_t(n) * size_t(rope_dim) : 0)) {}
};
}  // namespace

CudaModel::CudaModel(GgufFile file, const ModelOptions& opt)
    : file_(std::move(file)),
      config_(ModelConfig::from_gguf(file_)),
      host_weights_(bind_llama_weights(file_, config_)),
      knobs_(CudaKnobs::from_environment()) {
  const ModelConfig& c = config_;
  if (c.head_dim % 4 != 0 || c.head_dim > 256)
    throw ModelError(file_.path() + ": --device cuda supports head dimensions that are multiples of 4 up to 256, got " +
                     std::to_string(c.head_dim));
  if (c.n_expert > kMoeMaxExperts)
    throw ModelError(file_.path() + ": --device cuda routes over at most " + std::to_string(kMoeMaxExperts) +
                     " experts, this model has " + std::to_string(c.n_expert));
  rope_ = global_rope_params(c, host_weights_, opt.n_ctx);
  rope_swa_.head_dim = c.head_dim;
  rope_swa_.rope_dim = c.rope_dim;
  rope_swa_.freq_base = c.rope_freq_base_swa;  // unscaled (used only when > 0)
  // Before any upload or CUDA resource: a refused --kv-cache-dtype costs nothing.
  kv_dtype_ = resolve_kv_dtype(opt.kv_dtype);

  FDL_CUDA_CHECK(cudaDeviceGetAttribute(&n_sm_, cudaDevAttrMultiProcessorCount, 0));
  size_t free_b = 0, total_b = 0;
  FDL_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const uint64_t need = device_weight_bytes(host_weights_, c, knobs_.quant);
  // Block-quantized matrices kept as they are also need the F16 tile longer steps dequantize to.
  const uint64_t tile = need < device_weight_bytes(host_weights_, c, false) ? uint64_t(knobs_.dequant_tile_mb) << 20 : 0;
  if (need + tile + (256u << 20) > free_b)
    throw ModelError(file_.path() + ": --device cuda: the weights need " + std::to_string((need + tile) >> 20) +
                     " MiB of device memory, " + std::to_string(free_b >> 20) + " MiB are free");
  weights_ = upload_weights(host_weights_, c, knobs_.quant);
  {  // the model's resident bytes on this device
    int quantized = 0, matrices = 0;
    auto count = [&](const CudaMatrix& m) {
      if (m.view.data == nullptr) return;
      ++matrices;
      quantized += m.view.quantized() ? 1 : 0;
    };
    count(weights_.token_embd);
    if (!c.tied_output) count(weights_.output);
    for (const CudaLayer& L : weights_.layers)
      for (const CudaMatrix* m : {&L.qkv, &L.wo, &L.gate_up, &L.down, &L.router, &L.experts_gate_up, &L.experts_down})
        count(*m);
    spdlog::info("{}: {:.2f} GiB of weights on GPU 0 ({} of {} matrices block-quantized as in the file), {:.2f} GiB "
                 "read per decode step",
                 file_.path(), double(weights_.bytes) / double(1ull << 30), quantized, matrices,
                 double(weights_.bytes_per_step) / double(1ull << 30));
  }
  if (opt.batch_invariant) {
    int major = 0;
    FDL_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    // The invariance rests on how an sm_90 tensor-core step rounds (gemm_k16.cu).
    const std::string missing = major != 9 ? "a GPU other than compute capability 9.x"
                                           : batch_invariant_support(c, weights_);
    invariant_ = missing.empty();
    if (!invariant_)
      spdlog::warn("{}: --batch-invariant on: no batch-invariant CUDA kernels for {}; outputs may depend on the batch",
                   file_.path(), missing);
  }
  FDL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  FDL_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  kv_arena_ = std::make_unique<KvArena>(stream_);
  for (UploadTurn& u : upload_turn_) {
    FDL_CUDA_CHECK(cudaEventCreateWithFlags(&u.uploaded, cudaEventDisableTiming));
    FDL_CUDA_CHECK(cudaEventCreateWithFlags(&u.consumed, cudaEventDisableTiming));
  }
  profiler_ = std::make_unique<OpProfiler>(stream_, knobs_.profile);
  graphs_ = std::make_unique<GraphCache>(knobs_.graphs && !knobs_.profile);  // profiling times every op
  runner_ = std::make_unique<LayerRunner>(config_, weights_, kv_dtype_, n_sm_, stream_, knobs_, *profiler_, invariant_);
  sampling_ = std::make_unique<DeviceSampling>(stream_, c.n_vocab, n_sm_, *profiler_, *graphs_);
}

CudaModel::~CudaModel() {
  if (stream_) cudaStreamSynchronize(stream_);  // uncollected submitted steps still write into our buffers
  if (copy_stream_) cudaStreamSynchronize(copy_stream_);
  kv_arena_.reset();  // waits for tier copies into and out of the arena
  sampling_.reset();
  for (UploadTurn& u : upload_turn_) {
    if (u.uploaded) cudaEventDestroy(u.uploaded);
    if (u.consumed) cudaEventDestroy(u.consumed);
  }
  graphs_.reset();
  runner_.reset();
  profiler_.reset();
  if (copy_stream_) cudaStreamDestroy(copy_stream_);
  if (stream_) cudaStreamDestroy(stream_);
}

std::vector<std::pair<std::string, double>> CudaModel::profile() const { return profiler_->totals(); }

void CudaModel::reset_profile() { profiler_->reset(); }

CudaModel::DecodeTrace CudaModel::decode_trace() const { return runner_->decode_trace(); }

void CudaModel::clear_decode_trace() { runner_->clear_decode_trace(); }

bool CudaModel::kv_host_pinned() const { return kv_arena_->host_pinned(); }

void CudaModel::bind_kv_pool(BlockPool& pool) {
  if (kv_arena_->ensure(pool, sampling_->steps_in_flight())) graphs_->invalidate();
}

KvShape CudaModel::kv_shape(int block_size) const {
  if (block_size <= 0)
    throw std::invalid_argument("kv_shape: block size must be positive, got " + std::to_string(block_size));
  return KvShape{.n_layer = config_.n_layer, .n_kv_head = config_.n_head_kv, .head_dim = config_.head_dim,
                 .block_size = block_size, .dtype = kv_dtype_};
}

// ModelOptions::kv_dtype: auto is the weights' 16-bit type where every layer's matrices share
// it and head_dim is a multiple of 8 (16-byte rows); a 16-bit cache must be that type (the
// tensor-core tiles read a 16-bit cache's bytes as their mma operands, and the batch-1
// attention kernel is instantiated for fp32 or the weights' type). Head sizes the tiles do not
// take (not 64 or 128: Gemma's 256) run every step's attention through the per-token kernel,
// which reads any cache type.
KvDtype CudaModel::resolve_kv_dtype(std::optional<KvDtype> want) const {
  const ModelConfig& c = config_;
  std::optional<KvDtype> native;
  if (!host_weights_.layers.empty() && c.head_dim % 8 == 0) {
    const WType t = device_qkv_type(host_weights_.layers[0]);
    bool same = t != WType::F32;
    for (const LlamaLayerWeights& L : host_weights_.layers)
      same = same && device_qkv_type(L) == t && device_wo_type(L) == t;
    if (same) native = t == WType::F16 ? KvDtype::F16 : KvDtype::BF16;
  }
  if (!want) return native.value_or(KvDtype::F32);
  if (*want != KvDtype::F32 && want != native)
    throw ModelError(file_.path() + ": --kv-cache-dtype " + kv_dtype_name(*want) + ": --device cuda keeps a 16-bit KV " +
                     "cache only in the type of a model's 16-bit weights (head_dim a multiple of 8); this model allows " +
                     (native ? std::string(kv_dtype_name(*native)) + " or f32" : std::string("f32 only")));
  return *want;
}

// The CPU model's checks (model/step_batch_check.h), plus previous_step_id references in a
// submit_sample step and the size limit of the ancestor masks.
void CudaModel::validate(const StepBatch& b, const KvCache& kv, long chain_rows) {
  NegativeTokenCheck chained;
  if (chain_rows != kNoChain)  // submit_sample's previous_step_id
    chained = [chain_rows](size_t i, int32_t token) {
      if (chain_rows < 0)
        throw std::invalid_argument("submit_sample: token " + std::to_string(i) +
                                    " refers to the previous step's ids, but no submit_sample step ran since the "
                                    "last other forward");
      if (previous_step_row(token) >= chain_rows)
        throw std::out_of_range("submit_sample: token " + std::to_string(i) + " refers to row " +
                                std::to_string(previous_step_row(token)) + " of a previous step with " +
                                std::to_string(chain_rows) + " rows");
    };
  check_step_batch(b, kv, config_, kv_dtype_, tree_, chained);
  // After the per-token checks, so a batch the CPU model refuses with std::out_of_range is
  // refused the same way here whatever its tree's size.
  if (tree_.has_tree() && !supports_tree_verification())
    throw std::invalid_argument("forward: --device cuda verifies token trees only for models without a sliding "
                                "window of " + std::to_string(TokenTreeLayout::kMaskWindow) + " positions or fewer");
  if (tree_.window() > TokenTreeLayout::kMaskWindow)
    throw std::invalid_argument("forward: --device cuda verifies token trees of at most " +
                                std::to_string(TokenTreeLayout::kMaskWindow) + " nodes below their root, got " +
                                std::to_string(tree_.window()));
  kv_arena_->check_reported(kv);
}

void CudaModel::forward(const StepBatch& batch, KvCache& kv, std::vector<float>& logits) {
  sampling_->begin_plain_forward("forward");
  const int turn = acquire_upload_turn(batch);
  const StepEnd step_end{*this, turn};
  const int m = launch_step(batch, kv, turn, kNoChain);
  logits.resize(size_t(m) * size_t(config_.n_vocab));
  if (m > 0)
    FDL_CUDA_CHECK(cudaMemcpyAsync(logits.data(), runner_->logits(), logits.size() * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_));
  FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  profiler_->collect();
}

void CudaModel::forward_argmax(const StepBatch& batch, KvCache& kv, std::vector<int32_t>& ids) {
  sampling_->begin_plain_forward("forward_argmax");
  const int turn = acquire_upload_turn(batch);
  const StepEnd step_end{*this, turn};
  const int m = launch_step(batch, kv, turn, kNoChain, nullptr, Tail::Argmax);
  ids.resize(size_t(m));
  if (m > 0)
    FDL_CUDA_CHECK(cudaMemcpyAsync(ids.data(), runner_->ids(), size_t(m) * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                   stream_));
  FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  profiler_->collect();
}

// The sampling rows and penalty tokens are uploaded as is (DeviceSampling::upload_input): the
// host and device layouts must agree.
static_assert(sizeof(RowSampling) == sizeof(RowSamplingDev) && alignof(RowSampling) == alignof(RowSamplingDev));
static_assert(offsetof(RowSampling, temperature) == offsetof(RowSamplingDev, temperature) &&
              offsetof(RowSampling, top_k) == offsetof(RowSamplingDev, top_k) &&
              offsetof(RowSampling, top_p) == offsetof(RowSamplingDev, top_p) &&
              offsetof(RowSampling, min_p) == offsetof(RowSamplingDev, min_p) &&
              offsetof(RowSampling, uniform) == offsetof(RowSamplingDev, uniform) &&
              offsetof(RowSampling, repeat_penalty) == offsetof(RowSamplingDev, repeat_penalty) &&
              offsetof(RowSampling, frequency_penalty) == offsetof(RowSamplingDev, frequency_penalty) &&
              offsetof(RowSampling, presence_penalty) == offsetof(RowSamplingDev, presence_penalty));
static_assert(sizeof(PenaltyToken) == sizeof(PenaltyTokenDev) && offsetof(PenaltyToken, row) == offsetof(PenaltyTokenDev, row) &&
              offsetof(PenaltyToken, token) == offsetof(PenaltyTokenDev, token) &&
              offsetof(PenaltyToken, count) == offsetof(PenaltyTokenDev, count));

void CudaModel::forward_sample(const StepBatch& batch, KvCache& kv, std::span<const RowSampling> rows,
                               std::span<const PenaltyToken> penalties, std::vector<int32_t>& ids,
                               const TokenMasks& masks) {
  sampling_->begin_plain_forward("forward_sample");
  check_sampling_rows(batch, rows, penalties, config_.n_vocab, masks);
  const SamplingInput in{rows, penalties, masks};
  const int turn = acquire_upload_turn(batch);
  const StepEnd step_end{*this, turn};
  const int m = launch_step(batch, kv, turn, kNoChain, &in);
  ids.resize(size_t(m));
  if (m > 0) {
    sampling_->enqueue(m, turn, in, runner_->logits(), runner_->ids());
    FDL_CUDA_CHECK(cudaMemcpyAsync(ids.data(), runner_->ids(), size_t(m) * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                   stream_));
  }
  FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  profiler_->collect();
  throw_failed_row(ids, "forward_sample");
}

void CudaModel::submit_sample(const StepBatch& batch, KvCache& kv, std::span<const RowSampling> rows,
                              std::span<const PenaltyToken> penalties) {
  sampling_->check_room();
  check_sampling_rows(batch, rows, penalties, config_.n_vocab);
  const SamplingInput in{rows, penalties, {}};
  // Greedy rows without penalties need no sampling input: the graph ends with the checked
  // argmax, which writes the ids into the turn's landing buffer (safe to reuse: the step two
  // submissions later, the next to use this turn, comes after this one's collect_ids).
  const bool greedy = penalties.empty() && alternates(batch) &&
                      std::all_of(rows.begin(), rows.end(), [](const RowSampling& r) { return r.temperature == 0.0f; });
  const int turn = acquire_upload_turn(batch);
  const StepEnd step_end{*this, turn};
  const long chain_rows = sampling_->chain_rows();
  const int m = greedy ? launch_step(batch, kv, turn, chain_rows, nullptr, Tail::CheckedArgmax)
                       : launch_step(batch, kv, turn, chain_rows, &in);
  const bool chained = std::any_of(batch.tokens.begin(), batch.tokens.end(), [](int32_t t) { return t < 0; });
  sampling_->push_submitted(m, turn, greedy, chained, in, runner_->logits(), runner_->ids());
}

void CudaModel::collect_ids(std::vector<int32_t>& ids) { sampling_->collect(ids); }

bool CudaModel::alternates(const StepBatch& batch) { return batch.size() <= size_t(kGemvMaxTokens); }

int CudaModel::acquire_upload_turn(const StepBatch& batch) {
  const int turn = alternates(batch) ? turn_ : 0;
  UploadTurn& u = upload_turn_[turn];
  if (u.pending) {  // the last upload from this turn's page-locked buffers may not have run yet
    FDL_CUDA_CHECK(cudaEventSynchronize(u.uploaded));
    u.pending = false;
  }
  return turn;  // launch_step moves on to the other turn once a small step uploads into this one
}

void CudaModel::end_step(int turn) noexcept {
  // No throw: this also runs while an exception unwinds (StepEnd); a failing record leaves
  // the turn's previous event, and the error is sticky for the next CUDA call to report.
  if (cudaEventRecord(upload_turn_[turn].consumed, stream_) == cudaSuccess) upload_turn_[turn].in_use = true;
}

int CudaModel::launch_step(const StepBatch& batch, KvCache& kv, int turn, long chain_rows, const SamplingInput* sampling,
                           Tail tail) {
  validate(batch, kv, chain_rows);
  const int n = int(batch.size());
  if (n == 0) return 0;
  const ModelConfig& c = config_;
  if (kv_arena_->ensure(kv.pool(), sampling_->steps_in_flight())) graphs_->invalidate();
  kv_arena_->fence_tier_pulls(batch, kv);
  kv_arena_->sync_block_copies(kv);
  int m = 0, max_ctx = 0;
  m = int(batch.n_wanted());
  tree_step_ = tree_.has_tree();
  // Attention works on KV slots: a token's position, but further right for tree nodes, whose
  // trees thus are runs of consecutive slots (tiles like a prefill run).
  const int32_t* attn_pos = batch.positions.data();
  if (tree_step_) {
    tree_slots_.resize(size_t(n));
    for (int t = 0; t < n; ++t) tree_slots_[size_t(t)] = tree_.slot(size_t(t));
    attn_pos = tree_slots_.data();
  }
  for (int t = 0; t < n; ++t) max_ctx = std::max(max_ctx, attn_pos[t] + 1);

  // Pack the step's inputs into one pinned buffer; block tables of distinct sequences last.
  const bool swa_rope = c.rope_freq_base_swa > 0;
  const Layout lay(n, m, c.rope_dim, swa_rope);
  const int block_size = kv.pool().shape().block_size;
  size_t tables_len = 0;
  for (int t = 0; t < n; ++t) {
    const SeqId s = batch.seqs[size_t(t)];
    if (size_t(s) >= seq_table_off_.size()) seq_table_off_.resize(size_t(s) + 1, -1);
    if (seq_table_off_[size_t(s)] < 0) {
      seq_table_off_[size_t(s)] = int32_t(tables_len);
      tables_len += kv.block_table(s).size();
    }
  }
  // Steps above the GEMV size use the tiled attention kernel when it fits. On fp32 CUDA cores
  // tiles pay off only for runs of several tokens (a batch of single decode tokens is faster
  // per token); on tensor cores a tile of one token is a memory-bound K/V stream with its
  // query heads as the rows (GQA), so every such step uses them.
  // Soft-capped scores run the per-token kernel only (kernels.h: AttentionMasks).
  // Batch-invariant steps run every attention on the tensor-core tiles (one arithmetic per
  // row for every step size), with context splits at fixed positions.
  use_tiles_ = invariant_ || (n > kGemvMaxTokens && knobs_.attn_tiles && c.attn_softcap == 0 &&
                              attention_tiles_supported(c.head_dim, c.n_head, c.n_head_kv));
  if (use_tiles_) {
    tile_starts_.resize(size_t(n) + 1);
    n_tiles_ = attention_tiles(batch.seqs.data(), attn_pos, n, c.n_head, c.n_head_kv, tile_starts_.data());
    use_tiles_ = invariant_ || (runner_->attention_on_tensor_cores() && knobs_.decode_tiles) || n_tiles_ * 8 <= n;
    max_tile_rows_ = 0;
    for (int i = 0; i < n_tiles_; ++i)
      max_tile_rows_ = std::max(max_tile_rows_, (tile_starts_[size_t(i) + 1] - tile_starts_[size_t(i)]) * (c.n_head / c.n_head_kv));
  }
  // Scratch (the split-K partials above all) is sized for the kernel that will run.
  splits_ = invariant_  ? attention_invariant_splits(max_ctx)
            : use_tiles_ ? attention_tile_splits(n_tiles_, c.n_head_kv, n_sm_, max_ctx)
                         : attention_splits(n, c.n_head, c.n_head_kv, n_sm_, max_ctx);
  // Decode-sized invariant steps keep one partial per chunk, then one per share
  // (attention_invariant_chunk_partials).
  const int partial_splits =
      invariant_ && max_tile_rows_ > 0 && max_tile_rows_ <= 16 ? splits_ * (kInvariantShareChunks + 1) : splits_;
  if (runner_->ensure_scratch(n, m, partial_splits, sampling_->steps_in_flight())) graphs_->invalidate();
  // Tile starts and tree masks before the tables: the offsets then depend only on (n,
  // use_tiles_, tree_step_), which a captured graph's shape fixes (the tables' length varies
  // from step to step).
  const size_t tiles_at = lay.tables;
  const size_t tree_at = tiles_at + (use_tiles_ ? size_t(n) + 1 : 0);  // [n] base, then [2n] mask words
  const size_t first_at = tree_at + (tree_step_ ? 3 * size_t(n) : 0);  // [n] sliding-window starts
  const size_t tables_at = first_at + (c.sliding_window > 0 ? size_t(n) : 0);
  const size_t total = tables_at + tables_len;
  const size_t sampling_bytes = DeviceSampling::input_bytes(sampling);
  if (total > staging_cap_ || !sampling_->input_fits(turn, sampling_bytes)) {
    if (sampling_->steps_in_flight()) FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));  // submitted steps read them
  }
  if (total > staging_cap_) {  // grown by half again: the tables grow a little most steps,
    staging_cap_ = total + total / 2;  // and every move of the buffers drops the CUDA graphs
    for (DeviceBuffer<int32_t>& d : staging_dev_)
      if (d.grow(staging_cap_)) graphs_->invalidate();
  }
  sampling_->grow_input(turn, sampling_bytes);
  staging_host_[turn].grow(staging_cap_);
  int32_t* h = staging_host_[turn].get();
  int row = 0;
  for (int t = 0; t < n; ++t) {
    const SeqId s = batch.seqs[size_t(t)];
    const int32_t pos = batch.positions[size_t(t)];  // RoPE position (the cos/sin row below)
    const int32_t slot = attn_pos[t];                  // where K/V go and attention ends: pos but in a tree
    const std::span<const BlockId> table = kv.block_table(s);
    h[lay.tokens + size_t(t)] = batch.tokens[size_t(t)];
    h[lay.positions + size_t(t)] = slot;
    h[lay.dst_block + size_t(t)] = table[size_t(slot / block_size)];
    if (tree_step_) {
      // Ordinary tokens: nothing masked (the base lies past their last slot).
      const uint64_t mask = tree_.ancestor_mask(size_t(t));
      h[tree_at + size_t(t)] = batch.tree_parent[size_t(t)] == -1 ? slot + 1 : tree_.tree_base()[t];
      h[tree_at + size_t(n) + 2 * size_t(t)] = int32_t(uint32_t(mask));
      h[tree_at + size_t(n) + 2 * size_t(t) + 1] = int32_t(uint32_t(mask >> 32));
    }
    // A sliding layer reads the slots of the window's positions: a tree node's window (over its
    // RoPE position) starts below its root's slot (sliding_window > kMaskWindow, validate()).
    if (c.sliding_window > 0) h[first_at + size_t(t)] = std::max(0, pos - c.sliding_window + 1);
    h[lay.table_off + size_t(t)] = seq_table_off_[size_t(s)];
    if (batch.want_logits[size_t(t)]) h[lay.row_idx + size_t(row++)] = t;
    cpu::rope_cos_sin(rope_, pos, reinterpret_cast<float*>(h + lay.cos_sin) + size_t(t) * size_t(c.rope_dim));
    if (swa_rope)
      cpu::rope_cos_sin(rope_swa_, pos, reinterpret_cast<float*>(h + lay.cos_sin_swa) + size_t(t) * size_t(c.rope_dim));
  }
  for (int t = 0; t < n; ++t) {
    const SeqId s = batch.seqs[size_t(t)];
    if (seq_table_off_[size_t(s)] < 0) continue;
    const std::span<const BlockId> table = kv.block_table(s);
    std::memcpy(h + tables_at + size_t(seq_table_off_[size_t(s)]), table.data(), table.size() * sizeof(int32_t));
    seq_table_off_[size_t(s)] = -1;  // copied; also resets the map for the next step
  }
  if (use_tiles_) std::memcpy(h + tiles_at, tile_starts_.data(), (size_t(n_tiles_) + 1) * sizeof(int32_t));
  profiler_->mark(kUpload);  // start mark
  // The uploads run on the copy stream, beside the previous step's kernels, once the kernels
  // that read this turn's device buffers two steps ago are done; the kernels wait for them.
  UploadTurn& u = upload_turn_[turn];
  const cudaStream_t up = upload_stream();
  if (u.in_use) FDL_CUDA_CHECK(cudaStreamWaitEvent(up, u.consumed, 0));
  FDL_CUDA_CHECK(cudaMemcpyAsync(staging_dev_[turn].get(), h, total * sizeof(int32_t), cudaMemcpyHostToDevice, up));
  if (sampling_bytes > 0) sampling_->upload_input(turn, *sampling, up);
  FDL_CUDA_CHECK(cudaEventRecord(u.uploaded, up));
  u.pending = true;
  if (alternates(batch)) turn_ = turn ^ 1;  // the next small step uploads into the other turn's buffers
  if (up != stream_) FDL_CUDA_CHECK(cudaStreamWaitEvent(stream_, u.uploaded, 0));
  profiler_->mark(kUpload);
  const int32_t* d = staging_dev_[turn].get();
  StepInputs in;
  in.tokens = d + lay.tokens;
  in.positions = d + lay.positions;
  in.dst_block = d + lay.dst_block;
  in.table_off = d + lay.table_off;
  in.row_idx = d + lay.row_idx;
  in.cos_sin = reinterpret_cast<const float*>(d + lay.cos_sin);
  in.cos_sin_swa = swa_rope ? reinterpret_cast<const float*>(d + lay.cos_sin_swa) : nullptr;
  in.tables = d + tables_at;
  in.tile_starts = use_tiles_ ? d + tiles_at : nullptr;
  in.tree_base = tree_step_ ? d + tree_at : nullptr;
  in.tree_mask = tree_step_ ? reinterpret_cast<const uint32_t*>(d + tree_at + size_t(n)) : nullptr;
  in.first = c.sliding_window > 0 ? d + first_at : nullptr;
  in.splits = splits_;
  in.share_chunks = invariant_ ? kInvariantShareChunks : 0;
  in.n_tiles = n_tiles_;
  in.max_tile_rows = max_tile_rows_;
  in.kv = KvLayerView{kv_arena_->data(), 0, int64_t(kv_arena_->block_elems()), kv_arena_->shape().block_size,
                      c.n_head_kv, c.head_dim, kv_arena_->shape().dtype};

  // Graphs (graph_cache.h): the tile starts are device data, so the number of tiles is part
  // of the shape. The argmax tail's buffers are captured with the kernels: grown (and zeroed)
  // here, not while a graph is being captured.
  ArgmaxScratch tail_scratch;
  if (tail != Tail::None && m > 0) {
    tail_scratch = sampling_->argmax_scratch(m);
    if (tail == Tail::CheckedArgmax) sampling_->ensure_landing(turn, m);
  }
  auto kernels = [&] {
    runner_->run(n, m, in);
    if (tail != Tail::None && m > 0) {
      argmax_rows(runner_->logits(), m, c.n_vocab, runner_->ids(), stream_, tail == Tail::CheckedArgmax, tail_scratch,
                  tail == Tail::CheckedArgmax ? sampling_->landing_dev(turn) : nullptr);
      profiler_->mark(kSample);
    }
  };
  const GraphCache::StepShape shape{.tokens = n,
                                    .logit_rows = m,
                                    .splits = splits_,
                                    .tiles = use_tiles_ ? n_tiles_ : 0,
                                    .decode_tile_kernel = use_tiles_ && max_tile_rows_ <= 16,
                                    .trees = tree_step_,
                                    .tail = int(tail),
                                    .host_waits = runner_->host_waits(n)};
  graphs_->run(shape, turn, stream_, kernels);
  return m;
}

}  // namespace fdl::cuda
