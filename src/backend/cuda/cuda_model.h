// cuda_model.h — the Llama-family Model on an NVIDIA GPU (Device::Cuda).
//
// Memory: weights in HBM (cuda_weights.h); the KV cache in a device arena with the host
// BlockPool's layout and block ids (the pool still hands out ids, refcounts and metadata; its
// host arena only stages tier copies — a known waste of host memory until the pool can be
// told not to allocate). The arena is allocated on the first forward with a pool, sized from
// pool.capacity() and the pool's shape, and re-allocated if a different pool is passed. The
// device copy is authoritative: the model registers itself as the pool's BlockMirror, so the
// KV tiers pull a block's bytes from the device before demoting it and push promoted bytes
// back (kv_cache.h). Other host writes into the arena are not seen.
//
// One forward: one packed host->device copy (token ids, positions, destination blocks, block
// tables, RoPE cos/sin built on the host with the CPU code, rows that want logits), the
// kernels of kernels.h on one stream, one device->host copy of the wanted logits.
// Projections: gemv (fp32 activations) for up to kGemvMaxTokens tokens; above that cuBLAS —
// SGEMM for F32 weights, GemmEx with fp32 accumulation for F16/BF16 weights after rounding
// the activations to the weight type (as llama.cpp's GPU path does); this is the one place
// the CUDA numerics differ from the CPU's beyond reduction order.
// A single-token step (batch-1 decode) runs each layer as two kernels (kernels.h):
// decode_attention_block (norm, QKV, RoPE/KV store, attention, wo) and decode_ffn_block (norm,
// gate/up, SwiGLU, down), each one block per SM handing over between phases through counters.
// Where a shape does not allow them, or with FLASHDLLM_ATTN_BLOCK=0 / FLASHDLLM_FFN_BLOCK=0:
// gemv_norm_rope_qkv, attention, wo / gemv_norm_swiglu, down (the norms, RoPE and SwiGLU fused
// into the projections); FLASHDLLM_CUDA_FUSE=0 keeps the unfused chain. Attention of steps above 16 tokens runs in
// tiles on tensor cores (mma.sync, operands in the weights' 16-bit type, fp32 accumulation)
// when the weights are F16/BF16, on fp32 CUDA cores for F32 weights; FLASHDLLM_ATTN_TC=0/1
// forces either.
// CUDA graphs: a forward of up to kMaxGraphTokens tokens is captured once per (tokens, rows
// with logits, attention splits, attention tiles) shape and replayed; shapes above
// kGemvMaxTokens only from their second occurrence; at most kMaxGraphs, least recently used
// evicted. FLASHDLLM_CUDA_GRAPHS=0 launches kernel by kernel. Kernels are launched with
// programmatic dependent launch (launch.h; FLASHDLLM_PDL=0 turns it off).
//
// Token trees (StepBatch::tree_parent, speculative tree verification): validated and resolved
// on the host by TokenTreeLayout, as on the CPU (same checks and messages); a tree may hold at
// most TokenTreeLayout::kMaskWindow (64) nodes below its root (std::invalid_argument before
// anything is written otherwise). A tree batch uploads each token's KV slot as its position
// (RoPE uses the cos/sin table built from its real position), plus per token the first slot
// after its tree's root and its 64-bit ancestor mask over the slots from there. A tree is then
// a run of consecutive slots: it tiles like a prefill run, and every attention kernel (per
// token, fp32 tiles, tensor-core tiles) has a tree variant that masks the slots of other
// branches as it masks positions past a row's own. Without a tree nothing of this is uploaded
// or run: the kernels without masks. Tree steps are captured in graphs like other shapes (the
// shape key says whether a step has trees).
//
// Copy-on-write (fork_sequence, then append_slots into the shared tail) and slot moves
// (KvCache::move_slot, packing an accepted tree branch): each forward registers observers on
// its KvCache (set_block_copy_observer, set_slot_move_observer) that log, in one list in host
// order, the block copies and slot moves made in the host arena; the next forward on that
// cache first replays them in order as device-to-device copies on the compute stream, before
// any kernel (the device arena is written only by forwards, so the sources still hold their
// data then). The observers hold only a weak reference to the log: they outlive the model
// harmlessly. Copies and moves made in a cache before its first forward with this model are
// not logged (the device holds nothing of that cache yet); if another observer replaced ours
// in between, forward throws std::logic_error (blocks_copied() or slots_moved() grew by more
// than the log holds).
// Limits: head_dim a multiple of 4 and at most 256 (ModelError at load otherwise).
// Thread-safety: as the Model interface — forward is not reentrant.
#pragma once

#include <cublas_v2.h>

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <memory>
#include <utility>
#include <unordered_set>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_weights.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/tier_copier.h"
#include "flashdllm/model.h"
#include "model/token_tree.h"

namespace fdl::cuda {

class CudaModel final : public Model {
 public:
  /// Takes the mapped file; uploads the weights to the current device.
  CudaModel(GgufFile file, const ModelOptions& opt);
  ~CudaModel() override;

  const ModelConfig& config() const override { return config_; }
  const GgufFile& gguf() const override { return file_; }
  KvShape kv_shape(int block_size) const override;
  void forward(const StepBatch& batch, KvCache& kv, std::vector<float>& logits) override;
  int n_threads() const override { return 1; }
  /// As forward, but returns only the greedy id (argmax, lowest id on ties) of each row that
  /// wants logits, computed on the GPU: m int32 cross PCIe instead of m * n_vocab floats.
  void forward_argmax(const StepBatch& batch, KvCache& kv, std::vector<int32_t>& ids) override;
  /// As forward, but samples each wanted row on the GPU (kernels.h: apply_penalties, then
  /// sample_rows; every row, greedy ones included, is checked for NaN / +Inf / all -Inf): the
  /// rows' parameters and penalty tokens go up in one small copy and m int32 come back. The
  /// survivors are walked in id order, as on the host: the same token for the same uniform,
  /// up to rounding at the edges of the cumulative distribution.
  void forward_sample(const StepBatch& batch, KvCache& kv, std::span<const RowSampling> rows,
                      std::span<const PenaltyToken> penalties, std::vector<int32_t>& ids) override;
  /// Pipelined decode (Model::submit_sample): the step is queued on the model's stream
  /// with its sampling, and its ids are copied into page-locked memory that collect_ids reads
  /// after waiting for that copy; previous_step_id tokens are read by the embedding kernel
  /// from the ids the previous step left in device memory. Host-side inputs sit in two
  /// alternating page-locked buffers, so packing step N+1 never overwrites step N's inputs
  /// before they are uploaded.
  void submit_sample(const StepBatch& batch, KvCache& kv, std::span<const RowSampling> rows,
                     std::span<const PenaltyToken> penalties) override;
  void collect_ids(std::vector<int32_t>& ids) override;
  size_t submitted_steps() const override { return pending_count_; }
  bool prefers_device_sampling() const override { return true; }
  /// Trees of up to TokenTreeLayout::kMaskWindow nodes below their root (see above).
  bool supports_tree_verification() const override { return true; }
  /// Allocates the device KV arena for `pool` now (not at the first forward) and registers
  /// the model as its BlockMirror, so the KV tiers can page-lock their memory at start-up.
  void bind_kv_pool(BlockPool& pool) override;

  /// Device bytes of the weights, and the bytes one decode step streams (for bandwidth
  /// reports).
  uint64_t weight_bytes() const { return weights_.bytes; }
  /// Whether tier copies of the current KV pool run from page-locked host memory: the
  /// arena is pinned at the first tier copy (false before it, after the pool closed, or
  /// where the system refused to pin it).
  bool kv_host_pinned() const;
  /// How many KV caches' copy-on-write logs the model keeps: those of the pool its device arena
  /// holds, less those of destroyed caches (dropped at the next forward with tokens) (test
  /// hook: it must not grow with every cache ever used).
  size_t tracked_caches() const { return cache_copies_.size(); }
  /// With FLASHDLLM_CUDA_PROFILE=1 (which also turns graphs off): device milliseconds per
  /// op class (embed, norm, qkv, rope, attention, wo, gate_up, silu, down, output, upload),
  /// summed over the forwards since the last reset, timed with events between the ops.
  std::vector<std::pair<std::string, double>> profile() const;
  void reset_profile();
  uint64_t weight_bytes_per_step() const { return weights_.bytes_per_step; }
  int n_sm() const { return n_sm_; }

  /// With FLASHDLLM_DECODE_TRACE=1 (profiling): the globaltimer stamps (ns) that the
  /// persistent batch-1 kernels (decode_attention_block, decode_ffn_block) took at their phase
  /// edges in the last single-token forward, thread 0 of each block. attn[l][e][b] is event e
  /// (AttnTraceEvent, kernels.h) of block b < attn_blocks in layer l, ffn[l][e][b] likewise
  /// (FfnTraceEvent). Empty without the variable, or where those kernels do not run.
  /// Synchronizes the model's stream.
  struct DecodeTrace {
    int n_layer = 0, attn_events = 0, attn_blocks = 0, ffn_events = 0, ffn_blocks = 0;
    std::vector<uint64_t> attn, ffn;  // [n_layer][events][blocks]
  };
  DecodeTrace decode_trace() const;
  /// Zeroes the stamps (queued on the model's stream, before any later forward), so that a
  /// following decode_trace() holds only the forwards since; no-op without the variable.
  void clear_decode_trace();

 private:
  struct Staging;  // host-side offsets of the packed per-step inputs
  /// Checks the batch (throws as Model::forward documents) and resolves its trees into tree_.
  /// chain_rows: kNoChain for plain forwards (negative tokens are out of range), else the
  /// rows of the previous submit_sample step that previous_step_id tokens may refer to (-1:
  /// none).
  void validate(const StepBatch& b, const KvCache& kv, long chain_rows);
  static constexpr long kNoChain = -2;
  /// Validates, uploads the step's inputs and enqueues the kernels (or the graph); returns
  /// the number of rows with logits. The caller copies results out and synchronizes.
  /// Rows and penalty tokens of a sampled step, uploaded with its inputs.
  struct SamplingInput {
    std::span<const RowSampling> rows;
    std::span<const PenaltyToken> penalties;
  };
  /// Validates, uploads the step's inputs (and `sampling`'s) and enqueues the kernels (or the
  /// graph); returns the number of rows with logits. `turn` (acquire_upload_turn) picks the
  /// host and device input buffers; chain_rows as for validate. The caller enqueues the tail
  /// (copies, sampling), then end_step(turn), and synchronizes (or collect_ids does).
  /// What a step's kernels end with, inside its graph: nothing (the caller enqueues the tail),
  /// the greedy argmax into ids_ (forward_argmax), or the checked argmax into ids_ and the
  /// turn's mapped landing buffer (a pipelined greedy step: nothing at all runs outside the
  /// graph between two such steps).
  enum class Tail { None, Argmax, CheckedArgmax };
  int launch_step(const StepBatch& batch, KvCache& kv, int turn, long chain_rows, const SamplingInput* sampling = nullptr,
                  Tail tail = Tail::None);
  /// The turn whose input buffers the next step uses, once the host may overwrite its
  /// page-locked ones (their last upload has run). Small steps (decodes, <= kGemvMaxTokens
  /// tokens: what pipelining overlaps) alternate, and only once they upload (launch_step), so
  /// a refused step does not make the next one share a turn with the step before it (whose
  /// landing buffer it would overwrite). Larger steps (prompts) always use turn 0 and no
  /// landing buffer: their graphs are captured once, not once per turn (a capture of a
  /// 512-token step costs ~3 ms of TTFT).
  int acquire_upload_turn(const StepBatch& batch);
  static bool alternates(const StepBatch& batch);
  /// Marks the turn's device input buffers free for reuse once the kernels queued so far
  /// have run (the next upload into them waits for that). Called on every exit of a step
  /// (a scope guard), so it does not throw.
  void end_step(int turn) noexcept;
  /// Calls end_step(turn) on every exit of a step's scope: a step that throws after its
  /// upload must not leave its turn's buffers unguarded.
  struct StepEnd {
    CudaModel& model;
    int turn;
    ~StepEnd() { model.end_step(turn); }
  };
  /// Enqueues penalties + sampling of the step's m rows into ids_ (and ids_copy, if given:
  /// mapped page-locked memory) from turn's uploaded SamplingInput; rows that are all greedy
  /// (temperature 0) take the checked argmax instead of sample_rows.
  void enqueue_sampling(int m, int turn, const SamplingInput& in, int32_t* ids_copy = nullptr);
  /// argmax_rows' scratch for m rows (grown and zeroed here).
  ArgmaxScratch argmax_scratch(int m);
  /// Throws std::logic_error when submitted steps are uncollected (a plain forward now would
  /// be ordered between them), and forgets the chain: previous_step_id refers to nothing.
  void begin_plain_forward(const char* what);
  void ensure_arena(BlockPool& pool);
  class ArenaMirror;
  friend class ArenaMirror;
  /// Host <-> device copy of one block (BlockMirror, for the KV tiers), on the compute stream
  /// (ordered with every kernel and copy-on-write replay before and after it). A pull is
  /// synchronous; a push returns once queued (the host does not wait for the DMA): until
  /// settle_pushes() the host arena may still be read.
  void copy_block(uint64_t pool_uid, BlockId id, void* host, bool to_host);
  /// Waits until every queued push (or, given an id, the pushes of that block) has read its
  /// host bytes. Never throws: a failed wait means a device fault, which the next forward
  /// reports; the host bytes are then no longer read either.
  void settle_pushes(BlockId id = -1) noexcept;
  /// Before a step's kernels: the compute stream waits for tier pulls still reading a block
  /// the step writes (TierCopier::fence_writes).
  void fence_tier_pulls(const StepBatch& batch, KvCache& kv);
  size_t arena_block_elems() const;  // K/V elements per block (all layers), the pool's layout
  KvDtype resolve_kv_dtype(std::optional<KvDtype> want) const;
  void ensure_scratch(int n, int m, int splits);
  void prof(int kind);      // records an event closing an op of `kind` (profiling only)
  void collect_profile();   // after a synchronize
  void run_kernels(int n, int m);
  /// One layer of a single-token step: decode_attention_block / decode_ffn_block where chosen
  /// at load, else the fused kernels (gemv_norm_*), attention and plain GEMVs.
  void run_fused_layer(int l, const KvLayerView& kv, AttentionArgs& att);
  void run_attention_block(int l, const KvLayerView& kv, const NormIn& attn_in, float scale);
  void run_ffn_block(int l, const NormIn& ffn_in);
  /// Y = X·Wᵀ; X is fp32, or already in W's type when gemm_input_type(W, n) says so (the
  /// producers of GEMM inputs write that type directly: no separate cast pass).
  void matmul(const DeviceMatrix& W, const void* X, int n, float* Y);
  WType gemm_input_type(const DeviceMatrix& W, int n) const;

  GgufFile file_;
  ModelConfig config_;
  LlamaWeights host_weights_;  // views into file_ (and the rope factors the rope table uses)
  cpu::RopeParams rope_;
  CudaWeights weights_;
  int n_sm_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  bool use_graphs_ = true;
  bool profile_ = false;
  std::vector<cudaEvent_t> prof_events_;
  std::vector<int> prof_kinds_;
  size_t prof_used_ = 0;
  std::vector<double> prof_ms_;
  int splits_ = 1;  // attention context chunks of the current step
  bool fuse_enabled_ = true;  // FLASHDLLM_CUDA_FUSE=0: the unfused kernels for one token too
  int attn_block_groups_ = 0;  // > 0: batch-1 layers run decode_attention_block (blocks per KV head)
  int ffn_blocks_ = 0;         // > 0: batch-1 layers run decode_ffn_block on this many blocks
  DeviceBuffer<float> block_partial_;  // decode_attention_block's split partials
  DeviceBuffer<unsigned> block_sync_;  // hand-off counters: sync_per_layer() per layer
  DeviceBuffer<uint64_t> trace_;       // FLASHDLLM_DECODE_TRACE=1: per layer the attention then the FFN stamps
  size_t trace_per_layer() const;
  size_t attn_trace_blocks() const { return size_t(attn_block_groups_) * size_t(config_.n_head_kv); }
  size_t sync_per_layer() const { return size_t(config_.n_head_kv) + 2; }  // attention's n_kv + 1, the FFN's 1
  int output_blocks_ = 0;  // decode_output_block's grid for one-token steps; 0 = add_rms_norm + gemv
  KvDtype kv_dtype_ = KvDtype::F32;  // the KV cache's element type (ModelOptions::kv_dtype)
  bool attn_tc_ = false;  // attention tiles on tensor cores (16-bit mma; default for F16/BF16 weights)
  bool decode_tiles_ = true;  // FLASHDLLM_DECODE_TILES=0: decode batches keep the per-token kernel
  bool tiles_enabled_ = true;  // FLASHDLLM_ATTN_TILES=0 turns the tiled prefill kernel off
  bool use_tiles_ = false;
  int n_tiles_ = 0;
  int max_tile_rows_ = 0;  // rows of the largest tile (selects the decode-tile kernel when <= 16)
  TokenTreeLayout tree_;  // the current batch's trees (validate): KV slots and ancestor masks
  bool tree_step_ = false;  // the current step has trees: the attention kernels' masked variants
  std::vector<int32_t> tree_slots_;  // per token of a tree step: its KV slot
  std::vector<int32_t> tile_starts_;
  const int32_t* d_tiles_ = nullptr;

  // KV arena on the device, for one pool at a time.
  // The pool the arena serves: its uid (never reused, unlike an address) and its shape.
  uint64_t arena_uid_ = 0;
  KvShape arena_shape_{};
  size_t arena_blocks_ = 0;
  DeviceBuffer<float> arena_;
  // Copy-on-write / slot-move log (see the header comment): filled by the observers, replayed
  // and cleared by sync_block_copies at the start of each forward.
  struct KvCopy {
    BlockId src = 0, dst = 0;
    int src_slot = -1, dst_slot = -1;  // -1: the whole block (copy-on-write); else one slot, all layers
  };
  // The copies and moves of every KvCache on the arena's pool not yet done on the device, in
  // host order: one log per pool, not per cache, because a block one cache frees (a moved
  // slot's source, truncated) may be the next block another cache writes.
  struct CopyLog {
    std::vector<KvCopy> ops;
  };
  std::shared_ptr<CopyLog> pool_log_ = std::make_shared<CopyLog>();
  void replay_pool_log();
  void sync_block_copies(KvCache& kv);
  // What one cache's observers reported since its last forward (they hold this weakly; one
  // weak_ptr fits std::function's inline storage, so re-registering allocates nothing), and
  // where they log.
  struct Reported {
    std::weak_ptr<CopyLog> log;
    uint64_t copies = 0, moves = 0;
  };
  // Per KvCache (by uid): its counters at its last forward and its pool.
  struct CacheCopies {
    std::shared_ptr<Reported> reported = std::make_shared<Reported>();
    uint64_t seen = 0;        // blocks_copied()
    uint64_t moves_seen = 0;  // slots_moved()
    uint64_t pool_uid = 0;
    std::weak_ptr<const void> cache_alive;  // KvCache::lifetime(): expired entries are dropped
  };
  std::map<uint64_t, CacheCopies> cache_copies_;
  std::shared_ptr<ArenaMirror> mirror_;  // registered (weakly) with the pool the arena serves
  cudaEvent_t push_done_ = nullptr;      // recorded after the last push
  std::unordered_set<BlockId> pushed_;   // blocks whose pushes may still read the host arena
  std::unique_ptr<TierCopier> tier_copier_;  // asynchronous tier copies (BlockMirror::queue_copy)
  std::vector<BlockId> written_;             // fence_tier_pulls' scratch
  std::vector<BlockId> replay_targets_;      // replay_pool_log's scratch

  // Scratch (grow-only); `generation_` changes whenever any device pointer moves, which
  // invalidates the captured graphs.
  int cap_tokens_ = 0, cap_rows_ = 0;
  DeviceBuffer<float> x_, x2_, xn_, qkv_, q_, attn_, proj_, gu_, h_, out_rows_, logits_, partial_;
  DeviceBuffer<unsigned> argmax_counters_;        // argmax_rows' per-row counters (kept zero)
  DeviceBuffer<unsigned char> argmax_partials_;
  DeviceBuffer<int32_t> ids_;  // the last step's drawn ids (kept across growth: previous_step_id reads them)
  // forward_sample's rows + penalty tokens, staged; per turn
  PinnedBuffer<unsigned char> sampling_host_[2];
  DeviceBuffer<unsigned char> sampling_dev_[2];
  // Pipelined steps (submit_sample): per uncollected step, its ids' page-locked landing
  // place and the event after their copy, in a ring of kMaxSubmitted.
  struct SubmittedStep {
    PinnedBuffer<int32_t> ids;  // written by the sampling kernel through its device mapping
    int32_t* ids_dev = nullptr;
    const int32_t* ids_at = nullptr;  // where collect_ids reads them: `ids` or a landing buffer
    cudaEvent_t copied = nullptr;
    int rows = 0;
    bool chained = false;  // has previous_step_id tokens
  };
  SubmittedStep submitted_[kMaxSubmitted];
  size_t pending_first_ = 0, pending_count_ = 0;
  long chain_rows_ = -1;        // rows of the last submit_sample step's ids in ids_; -1: none
  bool chain_failed_ = false;   // a collected step had a failed row: the next chained step fails too
  // A step's inputs go up on copy_stream_ while the previous step's kernels run, so each
  // step uses one of two turns of input buffers (page-locked host and device staging,
  // sampling rows), alternating; graphs are captured per turn. `uploaded` (copy stream) says
  // the host buffers are free again and the device ones filled; `consumed` (compute stream)
  // that the kernels reading the device ones are done.
  struct UploadTurn {
    cudaEvent_t uploaded = nullptr, consumed = nullptr;
    bool pending = false;   // uploaded recorded, not waited for by the host yet
    bool in_use = false;    // consumed recorded
  };
  UploadTurn upload_turn_[2];
  int turn_ = 0;
  // Per turn: where a pipelined greedy step's graph writes its ids (mapped page-locked).
  PinnedBuffer<int32_t> landing_[2];
  int32_t* landing_dev_[2] = {nullptr, nullptr};
  cudaStream_t copy_stream_ = nullptr;
  cudaStream_t upload_stream() const { return profile_ ? stream_ : copy_stream_; }
  DeviceBuffer<uint16_t> xh_;  // activations rounded to F16/BF16 for cuBLAS
  DeviceBuffer<int32_t> staging_dev_[2];
  PinnedBuffer<int32_t> staging_host_[2];
  size_t staging_cap_ = 0;  // elements both staging buffers hold
  std::vector<int32_t> seq_table_off_;
  uint64_t generation_ = 0;
  // (tokens, logit rows, splits, tiles, whether the decode-tile kernel runs them, trees, turn, tail)
  using GraphShape = std::tuple<int, int, int, int, bool, bool, int, int>;
  struct CapturedStep {
    cudaGraphExec_t exec = nullptr;
    uint64_t last_use = 0;  // graph_clock_ at the last launch (the least recent is evicted)
  };
  std::map<GraphShape, CapturedStep> graphs_;
  uint64_t graph_clock_ = 0;
  std::set<GraphShape> graph_shapes_seen_;  // larger shapes run once ungraphed
  static constexpr int kMaxGraphTokens = 512;
  static constexpr size_t kMaxGraphs = 128;  // 64 shapes in both turns
  // 16-bit GEMMs of up to this many tokens (memory bound) go through the autotuned cuBLASLt
  // path (gemm_lt.h; FLASHDLLM_GEMM_TUNE=0: cublasGemmEx's default for all).
  static constexpr int kTunedGemmMaxTokens = 256;
  std::unique_ptr<LtGemm> lt_gemm_;
  static constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;
  DeviceBuffer<uint8_t> cublas_workspace_;
  uint64_t graphs_generation_ = 0;
  // Device pointers into staging_dev_ for the current (n, m).
  const int32_t *d_tokens_ = nullptr, *d_positions_ = nullptr, *d_dst_block_ = nullptr,
                *d_table_off_ = nullptr, *d_row_idx_ = nullptr, *d_tables_ = nullptr,
                *d_tree_base_ = nullptr;  // null without trees
  const uint32_t* d_tree_mask_ = nullptr;
  const float* d_cos_sin_ = nullptr;
};

}  // namespace fdl::cuda
