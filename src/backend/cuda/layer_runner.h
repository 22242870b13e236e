// layer_runner.h — the kernels of one CUDA forward, from the embedding to the logits, on the
// model's compute stream; the activation scratch they use; cuBLAS; the batch-1 block kernels'
// set-up and their phase trace.
//
// Numeric steps are the kernels of kernels.h in the same order as the CPU forward
// (src/model/llama_forward.cpp). Projections: gemv (fp32 activations) for up to
// kGemvMaxTokens tokens; above that cuBLAS — SGEMM for F32 weights (no TF32), GemmEx with fp32
// accumulation for F16/BF16 weights after rounding the activations to the weight type (as
// llama.cpp's GPU path does; the producers of GEMM inputs write that type directly), and for
// 16-bit weights up to kTunedGemmMaxTokens tokens the autotuned cuBLASLt path (gemm_lt.h;
// FLASHDLLM_GEMM_TUNE=0: cublasGemmEx's default for all); this is the one place the CUDA
// numerics differ from the CPU's beyond reduction order.
// A single-token step (batch-1 decode) runs each layer as two kernels (kernels.h):
// decode_attention_block (norm, QKV, RoPE/KV store, attention, wo) and decode_ffn_block (norm,
// gate/up, SwiGLU, down), each one block per SM handing over between phases through counters,
// and its output head as decode_output_block. Where a shape does not allow them, or with
// FLASHDLLM_ATTN_BLOCK=0 / FLASHDLLM_FFN_BLOCK=0 / FLASHDLLM_OUTPUT_BLOCK=0:
// gemv_norm_rope_qkv, attention, wo / gemv_norm_swiglu, down (the norms, RoPE and SwiGLU fused
// into the projections) / add_rms_norm + gemv; FLASHDLLM_CUDA_FUSE=0 keeps the unfused chain.
// A mixture of experts (moe.h) routes on the device; up to kGemvMaxTokens tokens run each
// (token, expert) pair's projections as routed GEMVs, with no host round trip; longer steps
// group the pairs by expert and read the group sizes back (one host wait per layer: those
// steps are not graphed, host_waits()), then run each expert's rows as one GEMM.
// Attention of steps above 16 tokens runs in tiles on tensor cores (mma.sync, operands in the
// weights' 16-bit type, fp32 accumulation) when the weights are F16/BF16, on fp32 CUDA cores
// for F32 weights; FLASHDLLM_ATTN_TC=0/1 forces either (a 16-bit KV cache always uses tensor
// cores). The caller picks the tiles and splits (StepInputs).
//
// Shapes: the scratch holds n tokens' activations (fp32; xh_ the 16-bit GEMM inputs) and m
// logits rows (m = rows that want logits, at least 1 allocated). Errors: CudaError /
// CublasError. Thread-safety: none (the model's thread); run() may be captured in a CUDA graph,
// so it allocates nothing (ensure_scratch first).
#pragma once

#include <cublas_v2.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_knobs.h"
#include "backend/cuda/cuda_weights.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/op_profiler.h"
#include "flashdllm/model.h"

namespace fdl::cuda {

/// What a step's kernels read besides the weights and the scratch: the device pointers into
/// the step's packed inputs (valid while its turn's buffers are; CudaModel's upload) and the
/// attention plan chosen for it.
struct StepInputs {
  const int32_t* tokens = nullptr;     ///< [n] token ids (negative: previous_step_id)
  const int32_t* positions = nullptr;  ///< [n] KV slots (a tree node's slot, else its position)
  const int32_t* dst_block = nullptr;  ///< [n] the block of each token's slot
  const int32_t* table_off = nullptr;  ///< [n] where each token's block table starts in `tables`
  const int32_t* row_idx = nullptr;    ///< [m] the tokens whose rows want logits
  const int32_t* tables = nullptr;     ///< the step's sequences' block tables
  const float* cos_sin = nullptr;      ///< [n][rope_dim] RoPE cos/sin rows
  const float* cos_sin_swa = nullptr;  ///< the sliding layers' own (Gemma 3), else null
  const int32_t* tile_starts = nullptr;  ///< [n_tiles + 1]; null: the per-token attention kernel
  const int32_t* tree_base = nullptr;    ///< [n] first slot after a token's tree root; null without trees
  const uint32_t* tree_mask = nullptr;   ///< [n][2] 64-bit ancestor masks; null without trees
  const int32_t* first = nullptr;        ///< [n] first slot a sliding layer reads; null without a window
  int splits = 1;                      ///< attention context chunks
  int share_chunks = 0;                ///< batch-invariant fixed context shares (AttentionArgs::share_chunks)
  int n_tiles = 0;
  int max_tile_rows = 0;  ///< rows of the largest tile (selects the decode-tile kernel when <= 16)
  KvLayerView kv;         ///< the KV arena (layer_offset 0: run() sets each layer's)
};

/// With FLASHDLLM_DECODE_TRACE=1 (profiling): the globaltimer stamps (ns) that the persistent
/// batch-1 kernels (decode_attention_block, decode_ffn_block) took at their phase edges in the
/// last single-token forward, thread 0 of each block. attn[l][e][b] is event e
/// (AttnTraceEvent, kernels.h) of block b < attn_blocks in layer l, ffn[l][e][b] likewise
/// (FfnTraceEvent). Empty without the variable, or where those kernels do not run.
struct DecodeTrace {
  int n_layer = 0, attn_events = 0, attn_blocks = 0, ffn_events = 0, ffn_blocks = 0;
  std::vector<uint64_t> attn, ffn;  // [n_layer][events][blocks]
};

/// Why the batch-invariant kernels cannot run this model ("" when they can): they need
/// F16/BF16 projection and output matrices, no experts, no soft-capped scores and head_dim 64
/// or 128 (the tensor-core attention tiles).
std::string batch_invariant_support(const ModelConfig& config, const CudaWeights& weights);

class LayerRunner {
 public:
  /// Sets up cuBLAS (and cuBLASLt) on `stream` and chooses the single-token kernels for these
  /// weights. `config`, `weights` and `prof` must outlive the runner.
  /// `invariant`: every step runs the batch-invariant kernels (batch_invariant_support() must
  /// have found none missing): gemm_k16 for every projection, 16-bit activations whatever the
  /// step size, tensor-core attention tiles for every step, no fused single-token kernels.
  LayerRunner(const ModelConfig& config, const CudaWeights& weights, KvDtype kv_dtype, int n_sm, cudaStream_t stream,
              const CudaKnobs& knobs, OpProfiler& prof, bool invariant = false);
  ~LayerRunner();
  LayerRunner(const LayerRunner&) = delete;
  LayerRunner& operator=(const LayerRunner&) = delete;

  /// Whether tiled attention runs on tensor cores (16-bit mma).
  bool attention_on_tensor_cores() const { return attn_tc_; }
  /// Whether run() of n tokens waits for the host midway (a mixture of experts' grouped
  /// path): such a step cannot be captured in a CUDA graph.
  bool host_waits(int n) const { return config_.n_expert > 0 && n > kGemvMaxTokens; }
  /// Grows the scratch for a step of n tokens, m rows with logits and `splits` attention
  /// chunks (waiting for the compute stream first when `steps_in_flight`: submitted steps
  /// still use the buffers). The last step's ids move along. Returns true when any buffer
  /// moved (captured graphs hold the old addresses).
  bool ensure_scratch(int n, int m, int splits, bool steps_in_flight);
  /// Enqueues the step's kernels: embedding, the layers, then the m wanted rows' final norm
  /// and output projection into logits().
  void run(int n, int m, const StepInputs& in);
  /// [m][n_vocab] fp32 logits of the last step (device).
  float* logits() const { return logits_.get(); }
  /// [m] ids the last step's sampling drew (device; kept across scratch growth: the next
  /// step's previous_step_id tokens are read from here).
  int32_t* ids() const { return ids_.get(); }

  /// Block-quantized matrices multiplied by gemm_quant so far (counted as they are enqueued:
  /// a step replayed from a CUDA graph counts once, at its capture). Lets a test tell that
  /// the kernel it means to check ran, not the F16 tiles.
  uint64_t gemm_quant_matmuls() const { return gemm_quant_matmuls_; }

  /// See DecodeTrace; synchronizes the stream.
  DecodeTrace decode_trace() const;
  /// Zeroes the stamps (queued on the stream); no-op without the variable.
  void clear_decode_trace();

 private:
  /// One layer of a single-token step: decode_attention_block / decode_ffn_block where chosen
  /// at load, else the fused kernels (gemv_norm_*), attention and plain GEMVs.
  void run_fused_layer(int l, const StepInputs& in, const KvLayerView& kv, AttentionArgs& att);
  void run_attention_block(int l, const StepInputs& in, const KvLayerView& kv, const NormIn& attn_in, float scale);
  void run_ffn_block(int l, const NormIn& ffn_in);
  /// The attention half of layer l on n tokens as separate kernels (the residual in `resid`).
  void run_attention_half(int l, int n, const StepInputs& in, const KvLayerView& kv, AttentionArgs& att, float* resid,
                          const AttentionMasks& tree, const AttentionMasks& sliding);
  /// The attention half of an invariant one-token layer l as decode_attention_block_k16.
  void run_attention_block_k16(int l, const StepInputs& in, const AttentionArgs& att, const NormIn& attn_in);
  /// The mixture-of-experts FFN of layer l on n tokens' normed rows in xn_ (fp32), into proj_.
  void run_moe_ffn(int l, int n);
  /// Y = X·Wᵀ; X is fp32, or already in W's type when gemm_input_type(W, n) says so (the
  /// producers of GEMM inputs write that type directly: no separate cast pass).
  void matmul(const DeviceMatrix& W, const void* X, int n, float* Y);
  WType gemm_input_type(const DeviceMatrix& W, int n) const;
  /// matmul of a block-quantized W (see layer_runner.cpp).
  void matmul_quant(const DeviceMatrix& W, const void* X, int n, float* Y);
  /// Batch-invariant steps of n tokens (m rows of logits): the most workspace any of the
  /// model's projections needs from gemm_k16.
  size_t gemm_workspace_floats(int n, int m) const;
  /// The layer's bias and per-head norms for the RoPE step (all null for llama).
  QkvExtras extras(const CudaLayer& L) const;
  /// Layer l's post-FFN norm weight (the addend's post-norm for the next norm), or null (none,
  /// or l < 0).
  const float* post_ffn_norm(int l) const;
  /// The RoPE table layer l rotates with (the sliding layers' own where the model has one).
  const float* cos_sin(int l, const StepInputs& in) const;
  size_t trace_per_layer() const;
  // The persistent batch-1 kernels' grids (the invariant ones in invariant runners).
  size_t attn_trace_blocks() const {
    if (invariant_) return size_t(attn_k16_blocks_);
    return size_t(attn_block_groups_) * size_t(config_.n_head_kv) * size_t(attention_subgroups(config_.n_head, config_.n_head_kv));
  }
  size_t ffn_trace_blocks() const { return size_t(invariant_ ? ffn_k16_blocks_ : ffn_blocks_); }
  // The attention kernels' counters (decode_attention_block: n_kv + 1; the invariant one: 3),
  // then the FFN's one.
  size_t sync_per_layer() const { return std::max<size_t>(size_t(config_.n_head_kv) + 1, 3) + 1; }
  size_t ffn_sync_offset() const { return sync_per_layer() - 1; }

  const ModelConfig& config_;
  const CudaWeights& weights_;
  cudaStream_t stream_;
  OpProfiler& prof_;
  cublasHandle_t cublas_ = nullptr;
  // 16-bit GEMMs of up to this many tokens (memory bound) go through the autotuned cuBLASLt
  // path (gemm_lt.h; FLASHDLLM_GEMM_TUNE=0: cublasGemmEx's default for all).
  static constexpr int kTunedGemmMaxTokens = 256;
  static constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;
  DeviceBuffer<uint8_t> cublas_workspace_;
  std::unique_ptr<LtGemm> lt_gemm_;
  bool fuse_enabled_ = true;  // FLASHDLLM_CUDA_FUSE=0: the unfused kernels for one token too
  bool invariant_ = false;    // batch-invariant kernels for every step (ModelOptions::batch_invariant)
  bool quantized_ = false;    // some layer matrix is block-quantized (gemv_quant; no fused or block kernels)

  int attn_block_groups_ = 0;  // > 0: batch-1 layers run decode_attention_block (blocks per KV head)
  int ffn_blocks_ = 0;         // > 0: batch-1 layers run decode_ffn_block on this many blocks
  int ffn_k16_blocks_ = 0;     // > 0: invariant batch-1 layers run decode_ffn_block_k16 on this many
  int attn_k16_blocks_ = 0;    // > 0: ... and decode_attention_block_k16
  int output_k16_blocks_ = 0;  // > 0: ... and decode_output_block_k16
  int output_blocks_ = 0;  // decode_output_block's grid for one-token steps; 0 = add_rms_norm + gemv
  bool attn_tc_ = false;  // attention tiles on tensor cores (16-bit mma; default for F16/BF16 weights)
  DeviceBuffer<float> block_partial_;  // decode_attention_block's split partials
  DeviceBuffer<unsigned> block_sync_;  // hand-off counters: sync_per_layer() per layer
  DeviceBuffer<uint64_t> trace_;       // FLASHDLLM_DECODE_TRACE=1: per layer the attention then the FFN stamps
  // Scratch (grow-only).
  DeviceBuffer<float> x_, x2_, xn_, qkv_, q_, attn_, proj_, gu_, h_, out_rows_, logits_, partial_;
  DeviceBuffer<float> k_new_;  // decode_attention_block's raw new K, for families with per-head Q/K norms
  DeviceBuffer<uint16_t> xh_;  // activations rounded to F16/BF16 for cuBLAS
  DeviceBuffer<float> gemm_ws_;  // batch-invariant steps: gemm_k16's per-segment chains (its split tilings)
  // Block-quantized weights: gemv_quant's rounded activations, the dequantized F16 tile.
  DeviceBuffer<int8_t> q8_q_;
  DeviceBuffer<float> q8_d_;
  DeviceBuffer<int32_t> q8_s_;
  DeviceBuffer<uint16_t> dq_;
  DeviceBuffer<float> gemm_quant_ws_;  // gemm_quant's K-split partial sums
  bool gemm_quant_ = false;            // CudaKnobs::gemm_quant
  uint64_t gemm_quant_matmuls_ = 0;    // see gemm_quant_matmuls()
  DeviceBuffer<int32_t> ids_;  // the last step's drawn ids (kept across growth: previous_step_id reads them)
  // Mixture of experts (moe.h): router logits, the pairs' experts and weights, the grouped
  // path's order (perm, slot, offsets) and gathered rows, each pair's expert output.
  DeviceBuffer<float> router_, route_w_, moe_in_, moe_y_;
  DeviceBuffer<int32_t> route_ids_, moe_perm_, moe_slot_, moe_offsets_;
  PinnedBuffer<int32_t> moe_offsets_host_;
};

}  // namespace fdl::cuda
