// cuda_knobs.h — the environment knobs (FLASHDLLM_*) of the CUDA model, read once when a
// CudaModel is constructed (CudaKnobs::from_environment); docs/ENVIRONMENT.md lists them with
// every other variable the product reads. They are for benchmarking and diagnosis: the
// defaults are the fast, tested paths.
//
// For the on/off switches only the exact value "0" turns a feature off (any other value leaves
// it on); the diagnostic switches (profile, decode_trace) turn on with exactly "1".
//
// Knobs read where they are used, once per process (a function-local static at the first
// launch), not here:
//   FLASHDLLM_PDL          launch.h     "0": plain stream order instead of programmatic
//                                       dependent launch
//   FLASHDLLM_GEMV         gemv.cu      shape of the 1-2 token GEMV kernels ("16,1", "4,1",
//                                       "4,2"; default 8,1)
//   FLASHDLLM_GEMV_MULTI   gemv.cu      shape of the 3-16 token GEMV kernels ("4,2", "2,4",
//                                       "4,1"; default 2,2)
//   FLASHDLLM_GEMV_QUANT   gemv_quant.cu pairs in flight per lane of the 5-16 token
//                                       block-quantized GEMV ("2"; default 1)
//   FLASHDLLM_GEMV_QUANT_STAGED gemv_quant_staged.cu "0": the 1-4 token block-quantized GEMV
//                                       off
//   FLASHDLLM_ATTN_LANES   attention.cu lanes per position of the per-token attention kernel
//                                       (8, 16, 32; head_dim 128 with 3-4 query heads per KV
//                                       head only)
//   FLASHDLLM_ATTN_SPLITS  attention.cu forced number of context chunks (split-K) of the
//                                       per-token attention kernel (1..256; 0: automatic)
//
// Thread-safety: from_environment() calls std::getenv (not while another thread changes the
// environment); a CudaKnobs is a plain value.
#pragma once

#include <optional>

namespace fdl::cuda {

struct CudaKnobs {
  /// FLASHDLLM_GEMM_TUNE (default on; "0": off): 16-bit GEMMs of 17..256 tokens go through the
  /// autotuned cuBLASLt path (gemm_lt.h); off, cublasGemmEx's default algorithm for all.
  bool gemm_tune = true;
  /// FLASHDLLM_CUDA_GRAPHS (default on; "0": off): steps are captured in CUDA graphs and
  /// replayed (graph_cache.h); off, launched kernel by kernel.
  bool graphs = true;
  /// FLASHDLLM_ATTN_TILES (default on; "0": off): steps above kGemvMaxTokens tokens run the
  /// tiled attention kernels where the shape allows; off, the per-token split-K kernel.
  bool attn_tiles = true;
  /// FLASHDLLM_CUDA_FUSE (default on; "0": off): a single-token step fuses the norms, RoPE and
  /// SwiGLU into its projections and may use the batch-1 block kernels; off, the unfused chain
  /// for one token too (and none of the block kernels).
  bool fuse = true;
  /// FLASHDLLM_ATTN_TC (default unset): tiled attention on tensor cores ("1": true) or on fp32
  /// CUDA cores (any other value: false); unset, tensor cores for F16/BF16 weights and fp32
  /// tiles for F32 weights. A 16-bit KV cache always uses tensor cores.
  std::optional<bool> attn_tc;
  /// FLASHDLLM_DECODE_TILES (default on; "0": off): decode batches above kGemvMaxTokens
  /// tokens run tensor-core tiles of one token each; off, the per-token kernel.
  bool decode_tiles = true;
  /// FLASHDLLM_ATTN_BLOCK (default on; "0": off): batch-1 decode runs the attention half of a
  /// layer as the one decode_attention_block kernel where the shapes allow.
  bool attn_block = true;
  /// FLASHDLLM_FFN_BLOCK (default on; "0": off): the FFN half of a batch-1 layer as the one
  /// decode_ffn_block kernel where the shapes allow.
  bool ffn_block = true;
  /// FLASHDLLM_OUTPUT_BLOCK (default on; "0": off): the batch-1 final norm and output
  /// projection as the one decode_output_block kernel where the output matrix allows.
  bool output_block = true;
  /// FLASHDLLM_CUDA_QUANT (default on; "0": off): Q8_0, Q4_K, Q5_K and Q6_K weights stay
  /// block-quantized in device memory (gemv_quant); off, they are widened to F16 at load.
  bool quant = true;
  /// FLASHDLLM_DEQUANT_TILE_MB (default 512, 1..4096): steps above kGemvMaxTokens tokens
  /// (above kGemmQuantMaxTokens with gemm_quant on) dequantize a block-quantized matrix to F16
  /// in tiles of at most this many MiB before each GEMM (docs/GPU.md: larger tiles measured
  /// faster than ones that stay in L2).
  int dequant_tile_mb = 512;
  /// FLASHDLLM_GEMM_QUANT (default off; "1": on): steps of 17-128 tokens multiply
  /// block-quantized matrices with gemm_quant instead of through the dequantized F16 tiles.
  bool gemm_quant = false;
  /// FLASHDLLM_DECODE_TRACE (default off; "1": on): the batch-1 block kernels write
  /// globaltimer stamps at their phase edges (CudaModel::decode_trace).
  bool decode_trace = false;
  /// FLASHDLLM_CUDA_PROFILE (default off; "1": on): device time per op class
  /// (CudaModel::profile, op_profiler.h); also turns CUDA graphs off.
  bool profile = false;

  /// The knobs as the environment sets them now.
  static CudaKnobs from_environment();
};

}  // namespace fdl::cuda
