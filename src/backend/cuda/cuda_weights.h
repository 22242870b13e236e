// cuda_weights.h — a Llama model's weights in device memory (HBM).
//
// Dtypes: F32, F16 and BF16 matrices keep their GGUF type (so an F32 model computes in fp32
// exactly like the CPU backend, and a BF16 model streams 2 bytes per weight). Q8_0, Q4_K, Q5_K
// and Q6_K matrices stay block-quantized (kernels.h: QType; a fused matrix of several of these
// types as runs of rows), unless keep_quantized is false; the other block-quantized types
// (Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K), matrices fused with a part of another type, the
// experts of a mixture, and the embedding and output of a model none of whose layer matrices
// stays quantized are dequantized at load to F16 (their values have up to ~21 significant
// bits, so this rounds; F16 keeps 11, BF16 would keep 8) and take F16's device memory. Norm
// vectors are fp32.
//
// Fusion at load: Q, K and V are stored as one [q_dim + 2*kv_dim][n_embd] matrix, gate and up
// as one [2*n_ff][n_embd] matrix, so a dense decode step launches 4 projections per layer, not
// 7, and each launch has enough rows to fill the GPU (a mixture of experts fuses each expert's
// gate and up the same way and stacks the experts). Parts of different types are widened to
// the widest (F32) before fusing.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/moe.h"
#include "model/llama_weights.h"

namespace fdl::cuda {

struct CudaMatrix {
  DeviceBuffer<uint8_t> storage;
  DeviceMatrix view;  ///< points into storage (or into another matrix's, for tied output)
};

/// `m` read as n_expert matrices of m.rows / n_expert rows each.
inline ExpertMatrices stacked_experts(const DeviceMatrix& m, int n_expert) {
  return ExpertMatrices{m.type, m.data, n_expert > 0 ? m.rows / n_expert : 0, m.cols, n_expert};
}

struct CudaLayer {
  DeviceBuffer<float> attn_norm, ffn_norm;
  CudaMatrix qkv, wo, gate_up, down;
  DeviceBuffer<float> qkv_bias;        ///< [q_dim + 2 kv_dim] fused like qkv; empty without biases
  DeviceBuffer<float> q_norm, k_norm;  ///< [head_dim] each; empty without per-head Q/K norms
  DeviceBuffer<float> post_attn_norm, post_ffn_norm;  ///< [n_embd] each; empty without post-norms
  /// Mixture of experts (gate_up and down empty): the router ([n_expert][n_embd]) and the
  /// experts' matrices stacked, expert e's gate/up fused like gate_up ([2 n_ff][n_embd]) and its
  /// down ([n_embd][n_ff]); one type per stack (F32 where the experts' types differ).
  CudaMatrix router, experts_gate_up, experts_down;
  int n_expert = 0;
  ExpertMatrices gate_up_experts() const { return stacked_experts(experts_gate_up.view, n_expert); }
  ExpertMatrices down_experts() const { return stacked_experts(experts_down.view, n_expert); }
};

struct CudaWeights {
  CudaMatrix token_embd;
  CudaMatrix output;  ///< view == token_embd.view when the model ties them (no copy)
  DeviceBuffer<float> output_norm;
  std::vector<CudaLayer> layers;
  uint64_t bytes = 0;  ///< device bytes held
  /// Bytes one decode step streams: every layer matrix (of a mixture of experts, the router
  /// and n_expert_used experts) plus the output projection (the embedding table is only
  /// gathered from).
  uint64_t bytes_per_step = 0;
};

/// The element types upload_weights() gives a layer's fused QKV matrix and its wo (F32 where
/// the fused parts' types differ), known before anything is uploaded.
WType device_qkv_type(const LlamaLayerWeights& L);
WType device_wo_type(const LlamaLayerWeights& L);
/// Device bytes upload_weights() will allocate for these host weights (for a fit check).
uint64_t device_weight_bytes(const LlamaWeights& w, const ModelConfig& c, bool keep_quantized);

/// One matrix of `parts` fused by rows (every part `cols` wide), stored as upload_weights()
/// stores a model's (tests use it to build matrices of given types). Same errors.
CudaMatrix upload_matrix(const std::vector<const cpu::WeightMatrix*>& parts, bool keep_quantized);

/// Copies (and where needed converts) every tensor to the current device.
/// Throws ModelError for a block-quantized value outside the F16 range (longer steps multiply
/// them as F16), CudaError on device failures.
CudaWeights upload_weights(const LlamaWeights& w, const ModelConfig& c, bool keep_quantized);

}  // namespace fdl::cuda
