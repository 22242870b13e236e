// Weight upload (see cuda_weights.h): raw copies when the GGUF type is kept, row-chunked host
// conversion otherwise.
#include "backend/cuda/cuda_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>
#include <string>

#include "flashdllm/dtype.h"

namespace fdl::cuda {
namespace {

WType natural_type(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return WType::F32;
    case GgmlType::BF16: return WType::BF16;
    default: return WType::F16;  // F16, and the block-quantized types dequantized to F16
  }
}

using Parts = std::vector<const cpu::WeightMatrix*>;

WType fused_type(const Parts& parts) {
  const WType first = natural_type(parts.front()->type);
  for (const auto* p : parts)
    if (natural_type(p->type) != first) return WType::F32;
  return first;
}

bool same_layout(GgmlType g, WType w) {
  return (g == GgmlType::F32 && w == WType::F32) || (g == GgmlType::F16 && w == WType::F16) ||
         (g == GgmlType::BF16 && w == WType::BF16);
}

/// Writes `m`'s rows as `type` to dst (device), converting on the host in chunks.
void upload_rows(const cpu::WeightMatrix& m, WType type, uint8_t* dst) {
  const size_t out_row = size_t(m.cols) * wtype_size(type);
  if (same_layout(m.type, type)) {
    FDL_CUDA_CHECK(cudaMemcpy(dst, m.data, out_row * size_t(m.rows), cudaMemcpyHostToDevice));
    return;
  }
  const size_t in_row = cpu::weight_row_bytes(m.type, m.cols);
  const int64_t chunk = std::max<int64_t>(1, int64_t((16u << 20) / out_row));
  std::vector<float> row(size_t(m.cols));
  std::vector<uint8_t> staged(out_row * size_t(chunk));
  for (int64_t r0 = 0; r0 < m.rows; r0 += chunk) {
    const int64_t nr = std::min(chunk, m.rows - r0);
    for (int64_t r = 0; r < nr; ++r) {
      dequantize_row(m.type, static_cast<const uint8_t*>(m.data) + size_t(r0 + r) * in_row, row.data(), row.size());
      uint8_t* out = staged.data() + size_t(r) * out_row;
      for (size_t k = 0; k < row.size(); ++k) {
        if (type == WType::F32) {
          std::memcpy(out + 4 * k, &row[k], 4);
        } else {
          if (type == WType::F16 && !(std::fabs(row[k]) <= 65504.f))
            throw ModelError("--device cuda: a " + ggml_type_name(static_cast<uint32_t>(m.type)) + " weight (" +
                             std::to_string(row[k]) + ") does not fit F16, the type block-quantized weights are " +
                             "dequantized to on the GPU");
          const uint16_t h = type == WType::F16 ? fp32_to_fp16(row[k]) : fp32_to_bf16(row[k]);
          std::memcpy(out + 2 * k, &h, 2);
        }
      }
    }
    FDL_CUDA_CHECK(cudaMemcpy(dst + size_t(r0) * out_row, staged.data(), size_t(nr) * out_row, cudaMemcpyHostToDevice));
  }
}

// Block-quantized matrices kept as they are (kernels.h: QType).

std::optional<QType> device_quant_type(GgmlType t) {
  switch (t) {
    case GgmlType::Q8_0: return QType::Q8_0;
    case GgmlType::Q4_K: return QType::Q4_K;
    case GgmlType::Q5_K: return QType::Q5_K;
    case GgmlType::Q6_K: return QType::Q6_K;
    default: return std::nullopt;
  }
}

/// The runs these parts would be stored as (consecutive parts of one type merged), or none
/// when they are widened: a part of another type, or more than kMaxQuantRuns runs.
std::vector<std::pair<QType, int64_t>> quant_runs(const Parts& parts, bool keep_quantized) {
  std::vector<std::pair<QType, int64_t>> runs;
  if (!keep_quantized) return runs;
  for (const auto* p : parts) {
    const auto t = device_quant_type(p->type);
    if (!t) return {};
    if (!runs.empty() && runs.back().first == *t)
      runs.back().second += p->rows;
    else
      runs.emplace_back(*t, p->rows);
  }
  if (runs.size() > size_t(kMaxQuantRuns)) return {};
  return runs;
}

/// The largest magnitude any value of block `b` of type t can have (from its scales).
float block_bound(GgmlType t, const unsigned char* b) {
  auto h = [](const unsigned char* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return std::fabs(fp16_to_fp32(v));
  };
  switch (t) {
    case GgmlType::Q8_0: return h(b) * 128.f;
    case GgmlType::Q4_K: return h(b) * 63.f * 15.f + h(b + 2) * 63.f;
    case GgmlType::Q5_K: return h(b) * 63.f * 31.f + h(b + 2) * 63.f;
    case GgmlType::Q6_K: return h(b + 208) * 128.f * 32.f;
    default: return 0.f;
  }
}

/// Steps above kGemvMaxTokens tokens multiply block-quantized weights as F16
/// (dequantize_to_f16): every value must fit it. Blocks whose scales allow a larger value are
/// dequantized and checked.
void check_f16_range(const cpu::WeightMatrix& m) {
  const auto traits = *ggml_type_traits(uint32_t(m.type));
  const auto* p = static_cast<const unsigned char*>(m.data);
  const size_t blocks = size_t(m.rows) * size_t(m.cols / traits.block_size);
  std::vector<float> values(traits.block_size);
  for (size_t i = 0; i < blocks; ++i, p += traits.type_size) {
    if (block_bound(m.type, p) <= 65504.f) continue;
    block_dequantizer(m.type)(p, values.data());
    for (float v : values)
      if (!(std::fabs(v) <= 65504.f))
        throw ModelError("--device cuda: a " + ggml_type_name(uint32_t(m.type)) + " weight (" + std::to_string(v) +
                         ") does not fit F16, the type block-quantized weights are multiplied in on the GPU");
  }
}

/// Writes `m`'s rows in the device layout of t (kernels.h: QType) to dst (device), in chunks.
void upload_quant_rows(const cpu::WeightMatrix& m, QType t, uint8_t* dst) {
  const size_t in_row = cpu::weight_row_bytes(m.type, m.cols), out_row = size_t(quant_row_bytes(t, m.cols));
  const auto* src = static_cast<const uint8_t*>(m.data);
  if (t == QType::Q4_K || t == QType::Q5_K) {  // the file's blocks as they are
    FDL_CUDA_CHECK(cudaMemcpy(dst, src, in_row * size_t(m.rows), cudaMemcpyHostToDevice));
    return;
  }
  const int64_t chunk = std::max<int64_t>(1, int64_t((16u << 20) / out_row));
  std::vector<uint8_t> staged(out_row * size_t(chunk));
  for (int64_t r0 = 0; r0 < m.rows; r0 += chunk) {
    const int64_t nr = std::min(chunk, m.rows - r0);
    std::fill(staged.begin(), staged.end(), uint8_t(0));
    for (int64_t r = 0; r < nr; ++r) {
      const uint8_t* in = src + size_t(r0 + r) * in_row;
      uint8_t* out = staged.data() + size_t(r) * out_row;
      if (t == QType::Q8_0) {  // qs of every block, then every d
        const int64_t nb = m.cols / 32;
        for (int64_t b = 0; b < nb; ++b) {
          std::memcpy(out + 32 * b, in + 34 * b + 2, 32);
          std::memcpy(out + m.cols + 2 * b, in + 34 * b, 2);
        }
      } else {  // Q6_K: ql, qh, scales, d of every block
        const int64_t nb = m.cols / 256;
        for (int64_t b = 0; b < nb; ++b) {
          const uint8_t* blk = in + 210 * b;
          std::memcpy(out + 128 * b, blk, 128);
          std::memcpy(out + 128 * nb + 64 * b, blk + 128, 64);
          std::memcpy(out + 192 * nb + 16 * b, blk + 192, 16);
          std::memcpy(out + 208 * nb + 2 * b, blk + 208, 2);
        }
      }
    }
    FDL_CUDA_CHECK(cudaMemcpy(dst + size_t(r0) * out_row, staged.data(), size_t(nr) * out_row, cudaMemcpyHostToDevice));
  }
}

CudaMatrix fuse_quantized(const Parts& parts, const std::vector<std::pair<QType, int64_t>>& runs) {
  const int64_t cols = parts.front()->cols;
  size_t bytes = 0;
  for (const auto& [t, rows] : runs) bytes += size_t(rows) * size_t(quant_row_bytes(t, cols));
  CudaMatrix out;
  out.storage.grow(bytes);
  uint8_t* at = out.storage.get();
  int64_t total = 0;
  size_t part = 0;
  QuantRuns q;
  for (const auto& [t, rows] : runs) {
    q.run[q.n++] = QuantRun{t, at, rows};
    for (int64_t left = rows; left > 0; ++part) {  // this run's parts
      const cpu::WeightMatrix& m = *parts[part];
      check_f16_range(m);
      upload_quant_rows(m, t, at);
      at += size_t(m.rows) * size_t(quant_row_bytes(t, cols));
      left -= m.rows;
    }
    total += rows;
  }
  out.view = DeviceMatrix{WType::F16, q.run[0].data, total, cols, q};
  return out;
}

CudaMatrix fuse(const Parts& parts, bool keep_quantized) {
  if (const auto runs = quant_runs(parts, keep_quantized); !runs.empty()) return fuse_quantized(parts, runs);
  const WType type = fused_type(parts);
  const int64_t cols = parts.front()->cols;
  int64_t rows = 0;
  for (const auto* p : parts) rows += p->rows;
  CudaMatrix out;
  out.storage.grow(size_t(rows) * size_t(cols) * wtype_size(type));
  int64_t at = 0;
  for (const auto* p : parts) {
    upload_rows(*p, type, out.storage.get() + size_t(at) * size_t(cols) * wtype_size(type));
    at += p->rows;
  }
  out.view = DeviceMatrix{type, out.storage.get(), rows, cols};
  return out;
}

DeviceBuffer<float> upload_vector(const float* v, int64_t n) {
  DeviceBuffer<float> out{size_t(n)};
  FDL_CUDA_CHECK(cudaMemcpy(out.get(), v, size_t(n) * sizeof(float), cudaMemcpyHostToDevice));
  return out;
}

uint64_t matrix_bytes(const Parts& parts, bool keep_quantized) {
  if (const auto runs = quant_runs(parts, keep_quantized); !runs.empty()) {
    uint64_t bytes = 0;
    for (const auto& [t, rows] : runs) bytes += uint64_t(rows) * uint64_t(quant_row_bytes(t, parts.front()->cols));
    return bytes;
  }
  uint64_t elems = 0;
  for (const auto* p : parts) elems += uint64_t(p->rows) * uint64_t(p->cols);
  return elems * wtype_size(fused_type(parts));
}

/// A layer's experts' gate and up rows in fused order (expert by expert, gate then up), and
/// their down matrices.
Parts expert_gate_up(const LlamaLayerWeights& L) {
  Parts p;
  for (const ExpertWeights& e : L.experts) p.insert(p.end(), {&e.gate, &e.up});
  return p;
}
Parts expert_down(const LlamaLayerWeights& L) {
  Parts p;
  for (const ExpertWeights& e : L.experts) p.push_back(&e.down);
  return p;
}

/// Bytes of a layer's FFN matrices on the device: the dense ones, or the router and every expert.
uint64_t ffn_bytes(const LlamaLayerWeights& L, bool q) {
  if (L.experts.empty()) return matrix_bytes({&L.w_gate, &L.w_up}, q) + matrix_bytes({&L.w_down}, q);
  // Experts are widened (the routed kernels read 16- and 32-bit rows).
  return matrix_bytes({&L.router}, q) + matrix_bytes(expert_gate_up(L), false) + matrix_bytes(expert_down(L), false);
}

/// Whether any layer matrix stays block-quantized. Only then do the embedding and the output
/// stay quantized too: a model whose layers are widened (Q4_0's, whose embedding is Q8_0) keeps
/// the 16-bit kernels, block kernels and batch invariance included, for the price of one matrix.
bool layers_stay_quantized(const LlamaWeights& w, bool keep_quantized) {
  if (!keep_quantized) return false;
  for (const LlamaLayerWeights& L : w.layers) {
    for (const Parts& parts : {Parts{&L.wq, &L.wk, &L.wv}, Parts{&L.wo}})
      if (!quant_runs(parts, true).empty()) return true;
    if (L.experts.empty()) {
      for (const Parts& parts : {Parts{&L.w_gate, &L.w_up}, Parts{&L.w_down}})
        if (!quant_runs(parts, true).empty()) return true;
    } else if (!quant_runs({&L.router}, true).empty()) {
      return true;
    }
  }
  return false;
}

}  // namespace

CudaMatrix upload_matrix(const std::vector<const cpu::WeightMatrix*>& parts, bool keep_quantized) {
  return fuse(parts, keep_quantized);
}

WType device_qkv_type(const LlamaLayerWeights& L) { return fused_type({&L.wq, &L.wk, &L.wv}); }
WType device_wo_type(const LlamaLayerWeights& L) { return fused_type({&L.wo}); }

uint64_t device_weight_bytes(const LlamaWeights& w, const ModelConfig& c, bool keep_quantized) {
  const bool q = layers_stay_quantized(w, keep_quantized);
  uint64_t total = matrix_bytes({&w.token_embd}, q) + (c.tied_output ? 0 : matrix_bytes({&w.output}, q));
  for (const LlamaLayerWeights& L : w.layers)
    total += matrix_bytes({&L.wq, &L.wk, &L.wv}, q) + matrix_bytes({&L.wo}, q) + ffn_bytes(L, q) + 2 * uint64_t(c.n_embd) * 4 +
             (L.bq ? uint64_t(L.wq.rows + L.wk.rows + L.wv.rows) * 4 : 0) + (L.q_norm ? 2 * uint64_t(c.head_dim) * 4 : 0) +
             (L.post_attn_norm ? 2 * uint64_t(c.n_embd) * 4 : 0);
  return total + uint64_t(c.n_embd) * 4;
}

CudaWeights upload_weights(const LlamaWeights& w, const ModelConfig& c, bool keep_quantized) {
  const bool q = layers_stay_quantized(w, keep_quantized);
  CudaWeights out;
  out.token_embd = fuse({&w.token_embd}, q);
  if (c.tied_output) {
    out.output.view = out.token_embd.view;
  } else {
    out.output = fuse({&w.output}, q);
  }
  out.output_norm = upload_vector(w.output_norm, c.n_embd);
  out.layers.resize(w.layers.size());
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LlamaLayerWeights& src = w.layers[l];
    CudaLayer& dst = out.layers[l];
    dst.attn_norm = upload_vector(src.attn_norm, c.n_embd);
    dst.ffn_norm = upload_vector(src.ffn_norm, c.n_embd);
    dst.qkv = fuse({&src.wq, &src.wk, &src.wv}, q);
    dst.wo = fuse({&src.wo}, q);
    uint64_t ffn_step_bytes = 0;  // what one token's FFN streams
    if (src.experts.empty()) {
      dst.gate_up = fuse({&src.w_gate, &src.w_up}, q);
      dst.down = fuse({&src.w_down}, q);
      ffn_step_bytes = dst.gate_up.storage.bytes() + dst.down.storage.bytes();
    } else {  // the router, then k of the n_expert experts per token
      dst.router = fuse({&src.router}, q);
      dst.experts_gate_up = fuse(expert_gate_up(src), false);
      dst.experts_down = fuse(expert_down(src), false);
      dst.n_expert = int(src.experts.size());
      ffn_step_bytes = dst.router.storage.bytes() + (dst.experts_gate_up.storage.bytes() + dst.experts_down.storage.bytes()) /
                                                        uint64_t(dst.n_expert) * uint64_t(c.n_expert_used);
    }
    if (src.bq) {  // fused in the order of the qkv rows
      std::vector<float> bias(src.bq, src.bq + src.wq.rows);
      bias.insert(bias.end(), src.bk, src.bk + src.wk.rows);
      bias.insert(bias.end(), src.bv, src.bv + src.wv.rows);
      dst.qkv_bias = upload_vector(bias.data(), int64_t(bias.size()));
    }
    if (src.q_norm) {
      dst.q_norm = upload_vector(src.q_norm, c.head_dim);
      dst.k_norm = upload_vector(src.k_norm, c.head_dim);
    }
    if (src.post_attn_norm) {
      dst.post_attn_norm = upload_vector(src.post_attn_norm, c.n_embd);
      dst.post_ffn_norm = upload_vector(src.post_ffn_norm, c.n_embd);
    }
    out.bytes_per_step += dst.qkv.storage.bytes() + dst.wo.storage.bytes() + ffn_step_bytes + 2 * dst.attn_norm.bytes() + dst.qkv_bias.bytes() +
                          dst.q_norm.bytes() + dst.k_norm.bytes() + dst.post_attn_norm.bytes() +
                          dst.post_ffn_norm.bytes();
  }
  const uint64_t out_bytes = matrix_bytes({c.tied_output ? &w.token_embd : &w.output}, q);
  out.bytes_per_step += out_bytes + out.output_norm.bytes();
  out.bytes = device_weight_bytes(w, c, keep_quantized);
  return out;
}

}  // namespace fdl::cuda
