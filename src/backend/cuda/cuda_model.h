// cuda_model.h — the Llama-family Model on an NVIDIA GPU (Device::Cuda).
//
// CudaModel is the Model facade over the CUDA backend's parts: it checks each batch, stages
// and uploads the step's inputs, and launches the step; the parts do the rest:
//   cuda_weights.h     the weights in HBM (uploaded at construction);
//   kv_arena.h         the KV cache on the device (one pool's arena, its BlockMirror for the
//                      KV tiers, the replay of host copy-on-write copies and slot moves);
//   layer_runner.h     the kernels of a forward (projections, attention, the batch-1 block
//                      kernels), the activation scratch, cuBLAS, the decode trace;
//   device_sampling.h  sampling on the GPU and the pipelined submit_sample / collect_ids ring;
//   graph_cache.h      CUDA graphs: steps captured once per shape and replayed;
//   op_profiler.h      device time per op class (FLASHDLLM_CUDA_PROFILE=1);
//   cuda_knobs.h       the FLASHDLLM_* environment knobs, read once at construction.
//
// One forward: one packed host->device copy (token ids, positions, destination blocks, block
// tables, RoPE cos/sin built on the host with the CPU code, rows that want logits), the
// kernels of kernels.h on one stream, one device->host copy of the wanted logits (or only the
// ids, forward_argmax / forward_sample). The inputs go up on a copy stream while the previous
// step's kernels run, into one of two alternating turns of buffers.
// Kernels are launched with programmatic dependent launch (launch.h; FLASHDLLM_PDL=0 turns it
// off).
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
// Limits: head_dim a multiple of 4 and at most 256 (ModelError at load otherwise).
// Thread-safety: as the Model interface — forward is not reentrant.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_knobs.h"
#include "backend/cuda/cuda_weights.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_sampling.h"
#include "backend/cuda/graph_cache.h"
#include "backend/cuda/kv_arena.h"
#include "backend/cuda/layer_runner.h"
#include "backend/cuda/op_profiler.h"
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
  bool batch_invariant() const override { return invariant_; }
  /// As forward, but returns only the greedy id (argmax, lowest id on ties) of each row that
  /// wants logits, computed on the GPU: m int32 cross PCIe instead of m * n_vocab floats.
  void forward_argmax(const StepBatch& batch, KvCache& kv, std::vector<int32_t>& ids) override;
  /// As forward, but samples each wanted row on the GPU (kernels.h: apply_penalties, then
  /// sample_rows; every row, greedy ones included, is checked for NaN / +Inf / all -Inf): the
  /// rows' parameters and penalty tokens go up in one small copy and m int32 come back. The
  /// survivors are walked in id order with the host's arithmetic: the same token for the
  /// same uniform.
  /// A grammar's masks (TokenMasks) go up with the rows and set the disallowed logits to -inf
  /// before the penalties.
  void forward_sample(const StepBatch& batch, KvCache& kv, std::span<const RowSampling> rows,
                      std::span<const PenaltyToken> penalties, std::vector<int32_t>& ids,
                      const TokenMasks& masks = {}) override;
  /// Pipelined decode (Model::submit_sample): the step is queued on the model's stream
  /// with its sampling, and its ids are copied into page-locked memory that collect_ids reads
  /// after waiting for that copy; previous_step_id tokens are read by the embedding kernel
  /// from the ids the previous step left in device memory. Host-side inputs sit in two
  /// alternating page-locked buffers, so packing step N+1 never overwrites step N's inputs
  /// before they are uploaded.
  void submit_sample(const StepBatch& batch, KvCache& kv, std::span<const RowSampling> rows,
                     std::span<const PenaltyToken> penalties) override;
  void collect_ids(std::vector<int32_t>& ids) override;
  size_t submitted_steps() const override { return sampling_->submitted(); }
  bool prefers_device_sampling() const override { return true; }
  /// Trees of up to TokenTreeLayout::kMaskWindow nodes below their root (see above).
  /// Trees whose window could cut into the tree itself are not (the masks cut below its root).
  bool supports_tree_verification() const override {
    return config_.sliding_window == 0 || config_.sliding_window > TokenTreeLayout::kMaskWindow;
  }
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
  size_t tracked_caches() const { return kv_arena_->tracked_caches(); }
  /// With FLASHDLLM_CUDA_PROFILE=1 (which also turns graphs off): device milliseconds per
  /// op class (embed, norm, qkv, rope, attention, wo, gate_up, silu, down, output, upload),
  /// summed over the forwards since the last reset, timed with events between the ops.
  std::vector<std::pair<std::string, double>> profile() const;
  void reset_profile();
  uint64_t weight_bytes_per_step() const { return weights_.bytes_per_step; }
  /// Block-quantized matrices multiplied by gemm_quant since load (LayerRunner::gemm_quant_matmuls;
  /// test hook).
  uint64_t gemm_quant_matmuls() const { return runner_->gemm_quant_matmuls(); }
  int n_sm() const { return n_sm_; }

  /// With FLASHDLLM_DECODE_TRACE=1 (profiling): the phase stamps of the persistent batch-1
  /// kernels in the last single-token forward (DecodeTrace, layer_runner.h). Synchronizes the
  /// model's stream.
  using DecodeTrace = cuda::DecodeTrace;
  DecodeTrace decode_trace() const;
  /// Zeroes the stamps (queued on the model's stream, before any later forward), so that a
  /// following decode_trace() holds only the forwards since; no-op without the variable.
  void clear_decode_trace();

 private:
  /// Checks the batch (throws as Model::forward documents) and resolves its trees into tree_.
  /// chain_rows: kNoChain for plain forwards (negative tokens are out of range), else the
  /// rows of the previous submit_sample step that previous_step_id tokens may refer to (-1:
  /// none).
  void validate(const StepBatch& b, const KvCache& kv, long chain_rows);
  static constexpr long kNoChain = -2;
  /// What a step's kernels end with, inside its graph: nothing (the caller enqueues the tail),
  /// the greedy argmax into the runner's ids (forward_argmax), or the checked argmax into them
  /// and the turn's mapped landing buffer (a pipelined greedy step: nothing at all runs outside
  /// the graph between two such steps).
  enum class Tail { None, Argmax, CheckedArgmax };
  /// Validates, uploads the step's inputs (and `sampling`'s) and enqueues the kernels (or the
  /// graph); returns the number of rows with logits. `turn` (acquire_upload_turn) picks the
  /// host and device input buffers; chain_rows as for validate. The caller enqueues the tail
  /// (copies, sampling), then end_step(turn), and synchronizes (or collect_ids does).
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
  KvDtype resolve_kv_dtype(std::optional<KvDtype> want) const;
  cudaStream_t upload_stream() const { return profiler_->enabled() ? stream_ : copy_stream_; }

  GgufFile file_;
  ModelConfig config_;
  LlamaWeights host_weights_;  // views into file_ (and the rope factors the rope table uses)
  cpu::RopeParams rope_;
  cpu::RopeParams rope_swa_;  ///< the sliding layers' (ModelConfig::rope_freq_base_swa > 0)
  CudaWeights weights_;
  CudaKnobs knobs_;
  int n_sm_ = 0;
  KvDtype kv_dtype_ = KvDtype::F32;  // the KV cache's element type (ModelOptions::kv_dtype)
  bool invariant_ = false;           // batch-invariant kernels (ModelOptions::batch_invariant, where supported)
  cudaStream_t stream_ = nullptr;       // the compute stream: every kernel, arena copy and sampling
  cudaStream_t copy_stream_ = nullptr;  // the steps' input uploads
  // The parts (created in the constructor once the streams exist, destroyed before them).
  std::unique_ptr<KvArena> kv_arena_;
  std::unique_ptr<OpProfiler> profiler_;
  std::unique_ptr<GraphCache> graphs_;
  std::unique_ptr<LayerRunner> runner_;
  std::unique_ptr<DeviceSampling> sampling_;

  // The current step's attention plan (launch_step) and trees.
  int splits_ = 1;  // attention context chunks of the current step
  bool use_tiles_ = false;
  int n_tiles_ = 0;
  int max_tile_rows_ = 0;  // rows of the largest tile (selects the decode-tile kernel when <= 16)
  TokenTreeLayout tree_;  // the current batch's trees (validate): KV slots and ancestor masks
  bool tree_step_ = false;  // the current step has trees: the attention kernels' masked variants
  std::vector<int32_t> tree_slots_;  // per token of a tree step: its KV slot
  std::vector<int32_t> tile_starts_;

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
  DeviceBuffer<int32_t> staging_dev_[2];
  PinnedBuffer<int32_t> staging_host_[2];
  size_t staging_cap_ = 0;  // elements both staging buffers hold
  std::vector<int32_t> seq_table_off_;
};

}  // namespace fdl::cuda
