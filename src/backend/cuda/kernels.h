// kernels.h — host-callable launchers of the CUDA kernels of a Llama forward pass.
//
// Conventions for every launcher: all pointers are device pointers; activations are fp32,
// row-major, one row per batch token; every reduction accumulates in fp32 (RMSNorm in fp64,
// like the CPU backend); launches go on `stream` and return immediately; launch errors are
// thrown as CudaError (cuda_check.h). None of them allocates, so all may be captured in a
// CUDA graph. Thread-safety: as safe as the stream they are given.
#pragma once

#include <cuda_runtime_api.h>

#include <climits>
#include <cstddef>
#include <cstdint>

#include "flashdllm/kv_dtype.h"

namespace fdl::cuda {

/// Element types of weight matrices in device memory.
enum class WType : int { F32 = 0, F16 = 1, BF16 = 2 };
inline size_t wtype_size(WType t) { return t == WType::F32 ? 4 : 2; }
const char* wtype_name(WType t);

/// Block-quantized formats kept as they are in device memory (gemv_quant.cu): GGUF's Q8_0,
/// Q4_K, Q5_K and Q6_K blocks (ggml's layouts). Q4_K and Q5_K rows are the file's blocks as
/// they are (144 and 176 bytes, multiples of 16); Q8_0 and Q6_K blocks are not 16-byte
/// multiples, so each of their rows is stored field by field ("planar"): Q8_0 as every
/// block's 32 int8 then every block's fp16 scale, Q6_K as every block's ql (128 bytes), then
/// qh (64), then scales (16), then d (fp16). Every row starts on 16 bytes
/// (quant_row_bytes()).
enum class QType : uint8_t { None = 0, Q8_0, Q4_K, Q5_K, Q6_K };
const char* qtype_name(QType t);
/// Bytes of one device row of `cols` values (a multiple of the type's block: 32 for Q8_0, 256
/// for the K-quants), padded to 16. constexpr: device code calls it too.
constexpr int64_t quant_row_bytes(QType t, int64_t cols) {
  switch (t) {
    case QType::Q8_0: return (cols + cols / 16 + 15) / 16 * 16;  // 32 int8 + one fp16 per 32 values
    case QType::Q4_K: return cols / 256 * 144;
    case QType::Q5_K: return cols / 256 * 176;
    case QType::Q6_K: return (cols / 256 * 210 + 15) / 16 * 16;
    default: return 0;
  }
}
/// A run of consecutive rows of one quantized type.
struct QuantRun {
  QType type = QType::None;
  const void* data = nullptr;  ///< rows x quant_row_bytes(type, cols) bytes
  int64_t rows = 0;
};
/// Up to kMaxQuantRuns runs stacked by rows: a fused matrix whose parts have different types
/// (Q4_K_M files keep some layers' V at Q6_K, so their QKV is a Q4_K run then a Q6_K run).
constexpr int kMaxQuantRuns = 3;
struct QuantRuns {
  int n = 0;  ///< 0: the matrix is not block-quantized
  QuantRun run[kMaxQuantRuns];
};

/// `rows` rows of `cols` elements of `type`, row-major, contiguous (W[r][k]).
/// Block-quantized matrices (quant.n > 0) keep their blocks (QuantRuns); `data` is then the
/// first run's and `type` is F16, the type their values are computed in where a kernel needs
/// them widened (GEMMs above kGemvMaxTokens tokens dequantize to F16 tiles; the KV cache and
/// attention tiles follow it). Only the launchers that say so accept them (gemv_quant,
/// dequantize_to_f16, embed_rows); every other weight kernel needs quant.n == 0.
struct DeviceMatrix {
  WType type = WType::F32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  QuantRuns quant = {};
  bool quantized() const { return quant.n > 0; }
};

/// out[t][c] = float(E[id][c]) for t < n, where id = ids[t] when ids[t] >= 0, else
/// prev_ids[-1 - ids[t]] (Model::submit_sample's previous_step_id: an id the previous step
/// drew on the device; prev_ids may be null when no id is negative). Ids >= 0 must be in
/// [0, E.rows) (checked on the host by the caller); a drawn id outside it (a failed row's -1)
/// reads row 0, and the host fails that step (CudaModel::collect_ids).
/// Each value is multiplied by `scale` (Gemma: sqrt(n_embd)).
void embed_rows(const DeviceMatrix& E, const int32_t* ids, const int32_t* prev_ids, int n, float* out,
                cudaStream_t stream, float scale = 1.f);
/// embed_rows of a block-quantized table (E.quantized()): each value as the CPU dequantizes it,
/// times `scale`. embed_rows calls it for such tables.
void embed_quant_rows(const DeviceMatrix& E, const int32_t* ids, const int32_t* prev_ids, int n, float* out,
                      cudaStream_t stream, float scale);

/// Residual add fused with RMSNorm, for r < n_rows (row width `width`):
///   src = row_idx ? row_idx[r] : r;   v = x[src] + (add ? add[src] : 0)
///   if write_back: x[src] = v;        y[r] = (v * scale) * w,  scale = 1/sqrt(mean(v²) + eps)
/// with the mean of squares summed in fp64 (as the CPU backend does). y must not alias x; it
/// is written as `y_type` (F16/BF16: rounded once, feeding a tensor-core GEMM directly).
/// width <= 16384 by design; this build launches rows up to 16 x the kernel's register-bound block
/// size (8192 at 512 threads) and throws CudaError for wider ones.
/// With add_w (Gemma's post-norms), add[src] is first RMS-normalized with weight add_w:
///   v = x[src] + (add[src] * scale_a) * add_w, scale_a = 1/sqrt(mean(add[src]²) + eps).
void add_rms_norm(float* x, const float* add, const float* w, void* y, const int32_t* row_idx,
                  int n_rows, int width, float eps, bool write_back, cudaStream_t stream,
                  WType y_type = WType::F32, const float* add_w = nullptr);

/// x[i] = cap * tanh(x[i] / cap) for i < n (Gemma 2's final logit soft-capping). cap > 0.
void softcap(float* x, size_t n, float cap, cudaStream_t stream);

/// Geometry of one layer of the paged KV arena on the device; the layout is the host pool's
/// (flashdllm/kv_cache.h): per block [layer][k|v][slot][kv_head][head_dim] elements of
/// `dtype` (fp32, or fp16 / bf16: kv_elem.cuh widens them on load and rounds on store).
struct KvLayerView {
  void* base = nullptr;        ///< the arena (block 0)
  int64_t layer_offset = 0;    ///< elements from a block's start to this layer's K
  int64_t block_stride = 0;    ///< elements per block
  int block_size = 0;          ///< token slots per block
  int n_head_kv = 0;
  int head_dim = 0;
  KvDtype dtype = KvDtype::F32;
};

/// The family's parts between the QKV projection and RoPE (ModelConfig::qkv_bias, qk_norm), in
/// the CPU forward's order: qkv += bias; each q head = RMSNorm(q head) * q_norm, each k head
/// likewise with k_norm (mean of squares summed in fp64, scale 1/sqrtf(mean + eps), (x·scale)·w).
/// Null members are absent; q_norm and k_norm are both set or both null. Device pointers.
struct QkvExtras {
  const float* bias = nullptr;    ///< [n_head hd + 2 n_head_kv hd]: [q | k | v] biases
  const float* q_norm = nullptr;  ///< [head_dim]
  const float* k_norm = nullptr;  ///< [head_dim]
  float eps = 0.f;
};

/// Splits the fused projection qkv[t] = [q (n_head*hd) | k (n_head_kv*hd) | v (n_head_kv*hd)]:
/// applies `extras` (bias, per-head q/k norms), rotates q and k with llama.cpp's normal-mode
/// RoPE using the per-token table cos_sin[t][2i] = cos θ_i, [2i+1] = sin θ_i (i < rope_dim/2,
/// built on the host), writes q to q_out[t] and k, v into slot positions[t] % block_size of
/// block dst_block[t]. With q/k norms one warp takes a head (head_dim <= 256).
void rope_qkv_store(const float* qkv, const float* cos_sin, const int32_t* positions,
                    const int32_t* dst_block, int n, int n_head, int rope_dim, const KvLayerView& kv,
                    float* q_out, cudaStream_t stream, const QkvExtras& extras = {});

/// Paged causal attention for n tokens of any number of sequences in one launch (GQA-aware,
/// split over the context). Token t attends to positions [0, positions[t]] of its sequence,
/// whose block table is tables[table_off[t] ...]. q, out: [n][n_head][head_dim].
/// `partial` must hold attention_partial_floats() floats. head_dim must be a multiple of 4
/// and at most 256.
struct AttentionArgs {
  KvLayerView kv;
  const float* q = nullptr;
  float* out = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* table_off = nullptr;
  const int32_t* tables = nullptr;
  int n_tokens = 0;
  int n_head = 0;
  float scale = 1.f;
  int n_splits = 1;            ///< context chunks per (token, head); see attention_splits()
  float* partial = nullptr;
  /// Optional (prefill): tiles from attention_tiles(), n_tiles + 1 starts in device memory.
  /// When set, the tiled kernel runs instead of the per-token one, with n_splits from
  /// attention_tile_splits() (partial must then hold attention_partial_floats() floats).
  const int32_t* tile_starts = nullptr;
  int n_tiles = 0;
  /// With tiles: run them on tensor cores (attention_mma.cu: mma.sync on 16-bit q, k, p, v
  /// with fp32 accumulation and softmax; ~3e-4 relative error with fp16 operands, ~3e-3 with
  /// bf16, instead of ~1e-6), same splits and partials.
  bool tensor_cores = false;
  /// With tensor cores over an fp32 cache: bf16 operands (8 significant bits, fp32's range;
  /// for BF16 models) instead of fp16 (11 bits, |x| < 65504). Over a 16-bit cache the
  /// operands are the cache's dtype (K/V are staged as stored), whatever this says.
  bool tc_bf16 = false;
  /// With tensor-core tiles: the most rows (tokens x query heads per KV head) of any tile, if
  /// known; 1..16 (decode batches) selects the kernel that splits each chunk over its warps.
  int max_tile_rows = 0;
  /// Batch-invariant steps (tensor-core tiles only): > 0 splits the context into fixed ranges
  /// of absolute positions, share_chunks (at most kInvariantShareChunks) chunks of 64 each
  /// (split z covers [z, z + 1) x 64 x share_chunks), folds each chunk's own partial
  /// (attention_fold.cuh) and always merges the splits' partials; n_splits must then be
  /// attention_invariant_splits(longest context). A row's result then depends on its own
  /// query and context only. 0: splits sized to fill the GPU (attention_tile_splits).
  int share_chunks = 0;
};
/// Chunks of 64 positions per context split in batch-invariant steps (AttentionArgs::share_chunks).
constexpr int kInvariantShareChunks = 4;
/// Splits covering a context of max_ctx positions in fixed shares of kInvariantShareChunks chunks.
int attention_invariant_splits(int max_ctx);
/// Whether a batch-invariant step computes each 64-position chunk of its shares in a warp of
/// its own (tensor-core tiles that all have <= 16 rows: decode, verification): one partial per
/// chunk, folded into the shares' partials and merged after. Its partial buffer must then hold
/// attention_partial_floats(n_tokens, n_head, head_dim, n_splits * (share_chunks + 1)) floats
/// (the chunks' partials, then the shares').
bool attention_invariant_chunk_partials(const AttentionArgs& a);
/// Masks for paged_attention (device arrays of n_tokens entries; all null: none).
/// Token trees (flashdllm/model.h, StepBatch::tree_parent): with `base` set, positions[t] is
/// token t's KV slot (not its RoPE position; a tree is then a run of consecutive slots and
/// tiles like a prefill run) and t reads slot j of [0, positions[t]] only when j < base[t] or
/// bit j - base[t] of its 64-bit ancestor mask (mask[2t] low word, mask[2t + 1] high word) is
/// set: masked slots are skipped as positions past the causal limit are. Ordinary tokens:
/// base[t] = positions[t] + 1, mask 0. positions[t] - base[t] must stay below 64 (the caller
/// refuses larger trees).
/// Sliding windows (ModelConfig::sliding_window): with `first` set, t reads no slot below
/// first[t] (<= positions[t]; for a tree token, its window must start below base[t]).
/// Every attention kernel has a masked variant; all null runs the kernels without masks.
/// Soft-capping (Gemma 2: each scaled score s becomes softcap * tanh(s / softcap)) also runs in
/// the masked variants, of the per-token kernel only (callers use no tiles with it).
struct AttentionMasks {
  const int32_t* base = nullptr;
  const uint32_t* mask = nullptr;
  const int32_t* first = nullptr;
  float softcap = 0.f;
  bool any() const { return base != nullptr || first != nullptr || softcap > 0; }
};
/// The tiled kernel on tensor cores (called by paged_attention when a.tensor_cores is set;
/// writes a.out when a.n_splits == 1, else the partials the combine kernel merges).
void attention_tiles_tc(const AttentionArgs& a, cudaStream_t stream, const AttentionMasks& masks = {});
/// Context shares per tile for the tiled kernel (fills the GPU; shares of >= 64 positions).
int attention_tile_splits(int n_tiles, int n_head_kv, int n_sm, int max_ctx);
/// Whether the tiled kernel handles this shape (head_dim 64 or 128).
bool attention_tiles_supported(int head_dim, int n_head, int n_head_kv);
/// Groups batch tokens into tiles for the tiled kernel: runs of consecutive tokens of one
/// sequence at consecutive positions, at most 128 / (n_head / n_head_kv) tokens each.
/// Host arrays; writes n_tiles + 1 starts (the last is n; room for n + 1 needed); returns
/// n_tiles.
int attention_tiles(const int32_t* seqs, const int32_t* positions, int n, int n_head, int n_head_kv,
                    int32_t* starts);
/// Context chunks per (token, kv head): enough blocks to fill `n_sm` multiprocessors and
/// chunks of ~128 positions for the longest context `max_ctx`; a power of two (<= 256).
/// Any value >= 1 is correct (empty chunks are skipped in the merge).
int attention_splits(int n_tokens, int n_head, int n_head_kv, int n_sm, int max_ctx);
size_t attention_partial_floats(int n_tokens, int n_head, int head_dim, int n_splits);
void paged_attention(const AttentionArgs& a, cudaStream_t stream, const AttentionMasks& masks = {});

#ifdef __CUDACC__
/// Device side of AttentionMasks, shared by attention.cu and attention_mma.cu. The masked
/// variants' kernel parameter: AttentionArgs plus the masks, a type of its own so that the
/// kernels without masks keep AttentionArgs as their parameter (same size: nvcc allocates
/// registers differently for a larger parameter struct even where the new fields go unread).
struct MaskedAttentionArgs : AttentionArgs {
  AttentionMasks masks;
};
inline MaskedAttentionArgs with_masks(const AttentionArgs& a, const AttentionMasks& masks) {
  MaskedAttentionArgs t;
  static_cast<AttentionArgs&>(t) = a;
  t.masks = masks;
  return t;
}
/// One token's masks: slots below `lo` are dropped (sliding window), and a slot j >= base is
/// read only where bit j - base is set (token tree).
struct RowMask {
  int lo;
  int base;
  uint64_t bits;
  /// For j <= the token's slot (so j - base < 64).
  __device__ bool keeps(int j) const { return j >= lo && (j < base || ((bits >> (j - base)) & 1u)); }
};
__device__ __forceinline__ RowMask row_mask_of(const MaskedAttentionArgs& a, int t) {
  RowMask r{a.masks.first != nullptr ? a.masks.first[t] : 0, INT_MAX, 0};
  if (a.masks.base != nullptr)
    r.base = a.masks.base[t], r.bits = uint64_t(a.masks.mask[2 * t]) | uint64_t(a.masks.mask[2 * t + 1]) << 32;
  return r;
}
/// The lowest first slot of batch tokens [t0, t0 + n) (a tile's; 0 without a window).
__device__ __forceinline__ int tile_first(const MaskedAttentionArgs& a, int t0, int n) {
  if (a.masks.first == nullptr) return 0;
  int lo = INT_MAX;
  for (int t = t0; t < t0 + n; ++t) lo = min(lo, a.masks.first[t]);
  return lo;
}
#endif

/// out[t][i] = silu(gu[t][i]) * gu[t][n_ff + i] for t < n, i < n_ff (gate and up fused as
/// one [n][2*n_ff] projection), written as `out_type`; with `gelu`, GeGLU: gelu_tanh(gate) * up
/// (ffn_act.cuh).
void silu_mul(const float* gu, void* out, int n, int n_ff, cudaStream_t stream, WType out_type = WType::F32,
              bool gelu = false);

/// Y[t][r] = sum_k X[t][k] * W[r][k] for t < n, r < W.rows; X fp32 [n][W.cols], Y fp32
/// [n][W.rows]. fp32 activations and accumulation; W is widened exactly. For n up to
/// kGemvMaxTokens; weight-bandwidth bound (each weight byte is read once per call).
constexpr int kGemvMaxTokens = 16;
void gemv(const DeviceMatrix& W, const float* X, int n, float* Y, cudaStream_t stream);

/// Activations of up to kGemvMaxTokens tokens rounded to 8 bits for gemv_quant, per group of
/// 32 values as llama.cpp's Q8_1: d = max|x| / 127, q = round-to-nearest-even(x / d) (a
/// group of zeros: d = 0, q = 0; a group holding NaN or Inf gets a NaN d, so its rows come out
/// NaN). Device buffers of n tokens' rows: q [n][cols] int8, d [n][cols / 32] fp32, s
/// [n][cols / 16] int32 (the sum of q over each 16 values, for the formats' offsets).
struct Q8Activations {
  int8_t* q = nullptr;
  float* d = nullptr;
  int32_t* s = nullptr;
  size_t capacity = 0;  ///< values the buffers hold (n x cols at most)
};
/// Y[t][r] = sum_k X[t][k] * W[r][k] for t < n (n <= kGemvMaxTokens) with a block-quantized W:
/// X (fp32 [n][W.cols]) is first rounded into `xq` (Q8Activations), then each row's blocks are
/// multiplied in integers (dp4a) and scaled in fp32, per 16 or 32 values in a fixed order:
/// a token's result does not depend on n or on the other tokens. W.cols must be a multiple of
/// 32 (Q8_0) or 256; X, Y device fp32. Throws CudaError for a matrix that is not quantized, n
/// out of range or xq too small.
void gemv_quant(const DeviceMatrix& W, const float* X, int n, float* Y, const Q8Activations& xq, cudaStream_t stream);
/// Rows [row0, row0 + n_rows) of a block-quantized W as F16 into out ([n_rows][W.cols]): each
/// value as the CPU's dequantizer computes it in fp32 (dtype.h), then rounded to nearest.
void dequantize_to_f16(const DeviceMatrix& W, int64_t row0, int64_t n_rows, void* out, cudaStream_t stream);

/// Input of the fused single-token projections below: the row v = x + add (add may be null)
/// of `W.cols` floats, normalized as add_rms_norm does: xn = (v * scale) * w. When x_out is
/// set, v is also written there (the updated residual stream); x_out must not alias x or add.
/// With add_w set, the addend is first RMS-normalized with that weight (a post-norm of the
/// sublayer that produced it, Gemma): v = x + (add * scale_a) * add_w, scale_a = 1/sqrt(mean(add²) + eps).
struct NormIn {
  const float* x = nullptr;
  const float* add = nullptr;
  const float* w = nullptr;
  float* x_out = nullptr;
  float eps = 0.f;
  const float* add_w = nullptr;
};
/// Whether the fused kernels take W: cols a multiple of 4, 16-byte rows, cols <= 16384, an
/// even row count, 16-byte-aligned data.
bool gemv_norm_supported(const DeviceMatrix& W);
/// One decode token: add_rms_norm, then gemv with the fused QKV matrix W ([q|k|v] rows), then
/// rope_qkv_store for token 0 (with `bias`, QkvExtras::bias, or null) — one kernel, the same
/// values (up to the order of the fp64 norm sum). W.rows must be (n_head + 2 * kv.n_head_kv) *
/// kv.head_dim. Per-head q/k norms need a whole head per step: gemv_norm_qkv then
/// rope_qkv_store instead.
void gemv_norm_rope_qkv(const DeviceMatrix& W, const NormIn& in, const float* cos_sin, const int32_t* positions,
                        const int32_t* dst_block, int n_head, int rope_dim, const KvLayerView& kv, float* q_out,
                        cudaStream_t stream, const float* bias = nullptr);
/// One decode token: add_rms_norm, then gemv with W into y (W.rows floats): the projection of
/// gemv_norm_rope_qkv without its epilogue.
void gemv_norm_qkv(const DeviceMatrix& W, const NormIn& in, float* y, cudaStream_t stream);
/// One decode token: add_rms_norm, then gemv with the fused gate/up matrix W ([gate|up],
/// 2*n_ff rows), then silu_mul: h[i] = silu(gate_i) * up_i for i < W.rows / 2 (fp32).
void gemv_norm_swiglu(const DeviceMatrix& W, const NormIn& in, float* h, cudaStream_t stream, bool gelu = false);

/// The attention half of a batch-1 decode layer in one kernel (decode_attention_block.cu):
///   v = in.x + in.add (block 0 writes v to in.x_out), xn = RMSNorm(v) * in.w,
///   qkv = wqkv · xn, the extras (bias, per-head q/k norms: QkvExtras), RoPE and K/V store
///   as rope_qkv_store (q to q_out; with q/k norms the raw k of the group goes to k_new and
///   each norm runs after the group's hand-off, in registers: a head's rows are spread over
///   the group's blocks),
///   attn_out = attention of q over positions [0, positions[0]] (the last `window` of them with
///   a sliding window) of the sequence whose block table is tables[table_off[0] ...] (causal, GQA),
///   y = wo · attn_out.
/// Blocks are grouped per KV head (attention_subgroups x blocks_per_group each, the latter from
/// attention_block_groups) and hand over through `sync`: n_head_kv + 1 counters that must be
/// zero at launch (they are left at their final values). `partial` holds attention_block_partial_floats() floats.
/// y may alias in.add (every block reads in.add before the grid-wide hand-off that precedes
/// any write of y); x_out must not alias y. in.w, q_out, attn_out and kv.base 16-byte aligned
/// (cudaMalloc'd buffers are).
/// Blocks wait for each other, so all must be resident at once: the grid is sized to the
/// device's SMs and the launcher refuses a grid the device cannot hold at once. Other work
/// holding SMs for as long as the kernel runs (e.g. two processes spinning under MPS, each on
/// part of the SMs) would make it wait forever; FLASHDLLM_ATTN_BLOCK=0 / FLASHDLLM_FFN_BLOCK=0
/// select the kernels without hand-offs.
/// Values agree with the separate kernels to fp32 rounding (other context split points).
/// What a layer's attention block does beyond Llama's: per-head Q/K norms (extras.q_norm), a
/// post-norm of the norm's addend (in.add_w), soft-capped scores. Head dimensions above 128 or
/// either of the last two take the block's wide variant: at most 2 query heads per KV head.
struct AttentionBlockFeatures {
  bool qk_norm = false, post_norm = false, softcap = false;
};
struct AttentionBlockArgs {
  WType type = WType::F32;       ///< of both matrices
  const void* wqkv = nullptr;    ///< [(n_head + 2 n_head_kv) hd][cols]: [q | k | v] rows
  const void* wo = nullptr;      ///< [wo_rows][n_head hd]
  int64_t wo_rows = 0;
  int cols = 0;                  ///< n_embd (wqkv's columns)
  NormIn in;
  const float* cos_sin = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* dst_block = nullptr;
  const int32_t* tables = nullptr;
  const int32_t* table_off = nullptr;
  int n_head = 0;
  int rope_dim = 0;
  float scale = 1.f;
  float softcap = 0.f;           ///< scores soft-capped: softcap * tanh(scale q·k / softcap); 0 = none
  int window = 0;                ///< sliding window (ModelConfig::attention_window); 0 = none
  KvLayerView kv;
  float* q_out = nullptr;        ///< [n_head hd] scratch (with Q/K norms: q before its norm and RoPE)
  QkvExtras extras;              ///< the family's bias / q,k norms (all null: none)
  float* k_new = nullptr;        ///< [n_head_kv hd] scratch, set when extras has q/k norms
  float* attn_out = nullptr;     ///< [n_head hd]
  float* partial = nullptr;
  float* y = nullptr;            ///< [wo_rows]
  unsigned* sync = nullptr;      ///< n_head_kv + 1 counters, zero at launch
  int blocks_per_group = 0;
  /// Profiling (FLASHDLLM_DECODE_TRACE=1), else null: [kAttnTraceEvents][gridDim.x] globaltimer
  /// stamps (ns) taken by thread 0 of each block at the phase edges named in AttnTraceEvent.
  /// Set, it launches a separately compiled kernel with the stamps (the untraced one carries
  /// none): the same results, but the registers (and spills) of another binary, so traced
  /// timings can differ slightly from untraced ones.
  uint64_t* trace = nullptr;
};
/// Phase edges stamped into AttentionBlockArgs::trace, in order.
enum AttnTraceEvent : int {
  kAttnEntry, kAttnAfterPdlWait, kAttnNormDone, kAttnQkvDone, kAttnQkvHandedOff, kAttnPartialDone,
  kAttnPartialsHandedOff, kAttnMergeDone, kAttnOutHandedOff, kAttnEnd, kAttnTraceEvents
};
/// Blocks per query-head sub-group for decode_attention_block on `n_sm` multiprocessors, or 0
/// when the shape is not supported (head_dim a multiple of 4 up to 256, up to 16 query heads
/// per KV head — 2 for the wide variant: AttentionBlockFeatures —, matching F32/F16/BF16
/// matrices with 16-byte rows, cols <= 16384, every block resident at once). `features` picks
/// the instantiation the grid is sized for; launches must pass the same ones.
int attention_block_groups(const DeviceMatrix& Wqkv, const DeviceMatrix& Wo, int n_head, const KvLayerView& kv,
                           int n_sm, const AttentionBlockFeatures& features = {});
size_t attention_block_partial_floats(int n_head, int head_dim, int blocks_per_group);
/// Sub-groups of at most 4 query heads each KV head's blocks form in decode_attention_block
/// (1 up to 4 query heads per KV head; Qwen2.5-7B's 7 take 2): the grid is n_head_kv x
/// subgroups x blocks_per_group blocks. Each sub-group attends for its own query heads; the
/// group's q/k/v rows are dealt over all of its blocks.
inline int attention_subgroups(int n_head, int n_head_kv) { return (n_head / n_head_kv + 3) / 4; }
void decode_attention_block(const AttentionBlockArgs& a, cudaStream_t stream);

/// The FFN half of a batch-1 decode layer in one kernel (decode_ffn_block.cu):
///   v = in.x + in.add (block 0 writes v to in.x_out), xn = RMSNorm(v) * in.w,
///   h = silu(gate · xn) * (up · xn) (w_gate_up = [gate | up] rows, as gemv_norm_swiglu),
///   y = w_down · h.
/// One block per SM (`blocks` from ffn_block_blocks); the down projection waits for all of h
/// behind `sync`, one counter that must be zero at launch. h: n_ff floats of scratch. y may
/// alias in.add (every block has read in.add before any writes y). in.w and h 16-byte
/// aligned. Values agree with gemv_norm_swiglu + gemv to fp32 rounding. Every block must be
/// resident at once (see AttentionBlockArgs).
struct FfnBlockArgs {
  WType type = WType::F32;         ///< of both matrices
  const void* w_gate_up = nullptr; ///< [2 n_ff][cols]
  const void* w_down = nullptr;    ///< [down_rows][n_ff]
  int64_t down_rows = 0;
  int cols = 0;
  int n_ff = 0;
  bool gelu = false;               ///< GeGLU (gelu_tanh(gate) * up) instead of SwiGLU
  NormIn in;
  float* h = nullptr;              ///< [n_ff]
  float* y = nullptr;              ///< [down_rows]
  unsigned* sync = nullptr;        ///< one counter, zero at launch
  int blocks = 0;
  /// Profiling, else null: [kFfnTraceEvents][blocks] globaltimer stamps (ns), as
  /// AttentionBlockArgs::trace (also a separately compiled kernel).
  uint64_t* trace = nullptr;
};
/// Phase edges stamped into FfnBlockArgs::trace, in order.
enum FfnTraceEvent : int {
  kFfnEntry, kFfnAfterPdlWait, kFfnNormDone, kFfnGateUpDone, kFfnHHandedOff, kFfnEnd, kFfnTraceEvents
};
/// Blocks for decode_ffn_block on `n_sm` multiprocessors (one per SM), or 0 when the matrices
/// are not supported (matching F32/F16/BF16 types, 16-byte rows, cols <= 16384, down's
/// columns = gate/up's rows / 2, h fits in shared memory).
int ffn_block_blocks(const DeviceMatrix& w_gate_up, const DeviceMatrix& w_down, int n_sm);
void decode_ffn_block(const FfnBlockArgs& a, cudaStream_t stream);

/// The attention half of a batch-1 decode layer in one kernel with the batch-invariant
/// arithmetic (decode_attention_block_k16.cu): the same bits as the invariant path's separate
/// kernels for one token, which are those of any step size —
///   add_rms_norm(in.x, in.add, in.w -> xn in the weights' type), gemm_k16(wqkv, xn) -> qkv,
///   rope_qkv_store(qkv, cos_sin, att.positions, dst_block, ..., q_out, bias) (q into q_out,
///   K/V into the cache), paged_attention(att) (its chunk partials and their fold),
///   the attention output rounded to the weights' type (attn16), gemm_k16(wo, attn16) -> y.
/// `att` is what paged_attention gets for the step (one token, one tile, tensor cores,
/// share_chunks > 0: attention_invariant_chunk_partials holds; no masks); att.out is not used.
/// Block 0 writes v = in.x + in.add to in.x_out (which must not alias in.x or in.add). One block
/// per SM (`blocks` from attention_block_k16_blocks), all resident; three grid-wide hand-offs
/// (q/k/v stored, chunk partials written, attention output written) through sync[0..2], zero
/// at launch. y may alias in.add. in.add_w must be null. CudaError for a shape
/// attention_block_k16_blocks refuses or other inputs outside this contract.
struct AttentionBlockK16Args {
  WType type = WType::F16;    ///< F16 or BF16, both matrices; the KV cache holds the same type
  const void* wqkv = nullptr; ///< [(n_head + 2 n_head_kv) hd][cols]: [q | k | v] rows
  const void* wo = nullptr;   ///< [wo_rows][n_head hd]
  int wo_rows = 0;
  int cols = 0;               ///< n_embd (wqkv's columns)
  NormIn in;
  AttentionArgs att;
  const float* cos_sin = nullptr;    ///< the token's RoPE table (rope_dim floats)
  const int32_t* dst_block = nullptr;
  int rope_dim = 0;
  const float* bias = nullptr;       ///< QkvExtras::bias, or null
  float* q_out = nullptr;            ///< [n_head hd]: receives q; must be att.q
  void* attn16 = nullptr;            ///< [n_head hd] of `type`: scratch
  float* y = nullptr;                ///< [wo_rows]
  unsigned* sync = nullptr;          ///< 3 counters, zero at launch
  int blocks = 0;
  /// Profiling, else null: [kAttnTraceEvents][blocks] globaltimer stamps (ns) at the phase edges
  /// of AttnTraceEvent (partials and merge: the chunk partials and their fold), as
  /// AttentionBlockArgs::trace (also a separately compiled kernel).
  uint64_t* trace = nullptr;
};
/// Blocks for decode_attention_block_k16 on `n_sm` multiprocessors (one per SM), or 0 when the
/// shape is not supported: matching F16 or BF16 matrices and a KV cache of their type,
/// head_dim 64 or 128, at most 16 query heads per KV head, cols and n_head x head_dim
/// multiples of 256, cols <= 8192, wo_rows a multiple of 8.
int attention_block_k16_blocks(const DeviceMatrix& wqkv, const DeviceMatrix& wo, int n_head, const KvLayerView& kv,
                               int n_sm);
/// The most context splits (AttentionArgs::n_splits) decode_attention_block_k16 takes.
constexpr int kAttentionBlockK16MaxSplits = 2048;
void decode_attention_block_k16(const AttentionBlockK16Args& a, cudaStream_t stream);

/// The FFN half of a batch-1 decode layer in one kernel with the batch-invariant arithmetic
/// (decode_ffn_block_k16.cu): the same bits as the invariant path's separate kernels for one
/// token, which are those of any step size —
///   add_rms_norm(in.x, in.add, in.w -> xn in the weights' type),
///   gemm_k16(w_gate_up, xn) -> gate | up,  h = silu_mul(gate, up) in the weights' type,
///   gemm_k16(w_down, h) -> y.
/// FfnBlockArgs as decode_ffn_block takes them, with these differences: `type` F16 or BF16;
/// `h` holds n_ff values of `type` (the n_ff floats of scratch are more than enough); in.x_out
/// must not alias in.x or in.add; in.add_w must be null (no post-norm).
/// `blocks` from ffn_block_k16_blocks. CudaError for a shape it refuses or other inputs outside
/// this contract.
/// Blocks for decode_ffn_block_k16 on `n_sm` multiprocessors (one per SM), or 0 when the
/// matrices are not supported: matching F16 or BF16 types, cols and n_ff multiples of 256
/// (whole batches of the chains' streaming), cols <= 8192 (a norm block of at most 512
/// threads), down_rows and n_ff multiples of 8, the operands in shared memory.
int ffn_block_k16_blocks(const DeviceMatrix& w_gate_up, const DeviceMatrix& w_down, int n_sm);
void decode_ffn_block_k16(const FfnBlockArgs& a, cudaStream_t stream);

/// One decode token's output head in one kernel (decode_output_block.cu): v = in.x + in.add
/// (block 0 writes v to in.x_out when set), RMSNorm with in.w, then y[r] = W[r] · norm(v) for
/// every row r of W ([rows][cols] of `type`), fp32 accumulation. `blocks` blocks of 512
/// threads (one per SM is the intent; none waits for another). Values agree with
/// add_rms_norm + gemv to fp32 rounding. W must pass output_block_supported; in.w holds cols
/// floats, 16-byte aligned; in.x_out must not alias in.x or in.add; 2 x cols floats of
/// shared memory per block. With softcap > 0 each y[r] is soft-capped as softcap() does.
struct OutputBlockArgs {
  WType type = WType::F32;
  const void* w = nullptr;
  int64_t rows = 0;
  int cols = 0;
  NormIn in;
  float* y = nullptr;  ///< [rows]
  int blocks = 0;
  float softcap = 0.f;  ///< final logit soft-capping (Gemma 2): softcap * tanh(y / softcap); 0 = none
};
/// Whether decode_output_block takes W: cols a multiple of 4 up to 8192, 16-byte rows,
/// 16-byte-aligned data.
bool output_block_supported(const DeviceMatrix& W);
void decode_output_block(const OutputBlockArgs& a, cudaStream_t stream);
/// The same head with the batch-invariant arithmetic (decode_output_block_k16.cu): the bits of
/// add_rms_norm (to the weights' type) + gemm_k16 for one row. OutputBlockArgs with `type` F16
/// or BF16, W passing output_block_k16_supported, in.add_w and in.x_out null (the residual is
/// not written), no softcap; `blocks` any count (none waits for another; one per SM is the
/// intent); shared memory: cols rounded up to 8 times 2 bytes, plus 128 x 8 x segments floats.
/// CudaError for anything else.
bool output_block_k16_supported(const DeviceMatrix& W);
void decode_output_block_k16(const OutputBlockArgs& a, cudaStream_t stream);

/// dst[i] = X[i] rounded to `type` (F16 or BF16, round to nearest even) for i < count.
void cast_f32(const float* X, size_t count, WType type, void* dst, cudaStream_t stream);

/// Device scratch that lets argmax_rows split the rows of a small batch over several blocks
/// (at most n_sm in all): `counters` holds one unsigned per row, zero before the first launch
/// (every launch leaves the counters it used at zero); `partials` argmax_partial_bytes(n_rows,
/// n_cols, n_sm) bytes.
struct ArgmaxScratch {
  unsigned* counters = nullptr;
  void* partials = nullptr;
  int n_sm = 0;
};
/// ids[r] = argmax_c logits[r][c] (lowest index on ties; NaN never wins) for r < n_rows; 0
/// for a row without a finite or +Inf entry. `checked` (the greedy rows of forward_sample):
/// -1 instead for a row holding NaN or +Inf, or only -Inf, as sample_rows does. With scratch,
/// each row's slices go to argmax_blocks_per_row blocks and the row's last block to finish
/// reduces their results; without, one block per row. The same ids either way.
/// `ids_copy` (optional) receives the ids too, as for sample_rows.
void argmax_rows(const float* logits, int n_rows, int n_cols, int32_t* ids, cudaStream_t stream, bool checked = false,
                 const ArgmaxScratch& scratch = {}, int32_t* ids_copy = nullptr);
/// Blocks argmax_rows gives each row with scratch (1: no scratch needed).
int argmax_blocks_per_row(int n_rows, int n_cols, int n_sm);
size_t argmax_partial_bytes(int n_rows, int n_cols, int n_sm);

/// One row's sampling parameters: the layout of fdl::RowSampling (flashdllm/sampling.h), which
/// cuda_model.cpp checks with static_asserts, so the host array is copied as is.
struct RowSamplingDev {
  float temperature;
  int32_t top_k;
  float top_p;
  float min_p;
  double uniform;
  float repeat_penalty;
  float frequency_penalty;
  float presence_penalty;
  int32_t reserved;
};
/// fdl::PenaltyToken's layout (checked likewise): one distinct token of row `row`'s window.
struct PenaltyTokenDev {
  int32_t row;
  int32_t token;
  int32_t count;
};
/// Stage 1 of the sampler in place: for i < n, logits[p.row][p.token] = penalize_logit(...,
/// p.count, params[p.row]'s penalties) with p = penalties[i] (flashdllm/sampling.h; the same
/// float operations, no fused multiply-add, so the row equals the host's bit for bit). Each
/// (row, token) at most once; rows and tokens in range (checked by the caller).
void apply_penalties(float* logits, int n_cols, const PenaltyTokenDev* penalties, int n,
                     const RowSamplingDev* params, cudaStream_t stream);
/// A grammar's masks in place (fdl::TokenMasks, uploaded as is): for i < n_masked,
/// logits[rows[i]][c] = -inf for every c < n_cols whose bit is clear in mask which[i] —
/// `words` holds the masks back to back, (n_cols + 63) / 64 64-bit words each, read as
/// little-endian pairs of 32-bit words (bit c in 32-bit word c / 32). Rows distinct, indices in
/// range (checked by the caller).
void apply_token_masks(float* logits, int n_cols, const int32_t* rows, const int32_t* which, const uint32_t* words,
                       int n_masked, cudaStream_t stream);
/// ids[r] = the token row r of `logits` ([n_rows][n_cols]) yields under params[r], for
/// r < n_rows: flashdllm/sampling.h's stages 2-6 (top-k, then top-p over the untempered
/// softmax of the survivors, min-p, temperature, then the survivor whose interval of the
/// cumulative weights, walked in id order, holds uniform · total). Ties at a top-k or top-p
/// cut keep the lowest ids, as on the host; temperature 0 gives the argmax (lowest id on
/// ties). -Inf logits are never drawn; a row with NaN or +Inf, or only -Inf, gives -1 (the
/// caller reports it). One block of 1024 threads per row (sampling.cu); deterministic.
/// `ids_copy` (optional) receives the ids too: page-locked host memory (mapped into the
/// device's address space under unified addressing) spares a device-to-host copy.
void sample_rows(const float* logits, int n_rows, int n_cols, const RowSamplingDev* params, int32_t* ids,
                 cudaStream_t stream, int32_t* ids_copy = nullptr);

}  // namespace fdl::cuda
