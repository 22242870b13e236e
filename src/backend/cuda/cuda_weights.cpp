// Weight upload (see cuda_weights.h): raw copies when the GGUF type is kept, row-chunked host
// conversion otherwise.
#include "backend/cuda/cuda_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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

CudaMatrix fuse(const Parts& parts) {
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

uint64_t matrix_bytes(const Parts& parts) {
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
uint64_t ffn_bytes(const LlamaLayerWeights& L) {
  if (L.experts.empty()) return matrix_bytes({&L.w_gate, &L.w_up}) + matrix_bytes({&L.w_down});
  return matrix_bytes({&L.router}) + matrix_bytes(expert_gate_up(L)) + matrix_bytes(expert_down(L));
}

}  // namespace

WType device_qkv_type(const LlamaLayerWeights& L) { return fused_type({&L.wq, &L.wk, &L.wv}); }
WType device_wo_type(const LlamaLayerWeights& L) { return fused_type({&L.wo}); }

uint64_t device_weight_bytes(const LlamaWeights& w, const ModelConfig& c) {
  uint64_t total = matrix_bytes({&w.token_embd}) + (c.tied_output ? 0 : matrix_bytes({&w.output}));
  for (const LlamaLayerWeights& L : w.layers)
    total += matrix_bytes({&L.wq, &L.wk, &L.wv}) + matrix_bytes({&L.wo}) + ffn_bytes(L) + 2 * uint64_t(c.n_embd) * 4 +
             (L.bq ? uint64_t(L.wq.rows + L.wk.rows + L.wv.rows) * 4 : 0) + (L.q_norm ? 2 * uint64_t(c.head_dim) * 4 : 0) +
             (L.post_attn_norm ? 2 * uint64_t(c.n_embd) * 4 : 0);
  return total + uint64_t(c.n_embd) * 4;
}

CudaWeights upload_weights(const LlamaWeights& w, const ModelConfig& c) {
  CudaWeights out;
  out.token_embd = fuse({&w.token_embd});
  if (c.tied_output) {
    out.output.view = out.token_embd.view;
  } else {
    out.output = fuse({&w.output});
  }
  out.output_norm = upload_vector(w.output_norm, c.n_embd);
  out.layers.resize(w.layers.size());
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LlamaLayerWeights& src = w.layers[l];
    CudaLayer& dst = out.layers[l];
    dst.attn_norm = upload_vector(src.attn_norm, c.n_embd);
    dst.ffn_norm = upload_vector(src.ffn_norm, c.n_embd);
    dst.qkv = fuse({&src.wq, &src.wk, &src.wv});
    dst.wo = fuse({&src.wo});
    uint64_t ffn_step_bytes = 0;  // what one token's FFN streams
    if (src.experts.empty()) {
      dst.gate_up = fuse({&src.w_gate, &src.w_up});
      dst.down = fuse({&src.w_down});
      ffn_step_bytes = dst.gate_up.storage.bytes() + dst.down.storage.bytes();
    } else {  // the router, then k of the n_expert experts per token
      dst.router = fuse({&src.router});
      dst.experts_gate_up = fuse(expert_gate_up(src));
      dst.experts_down = fuse(expert_down(src));
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
  const uint64_t out_bytes = uint64_t(out.output.view.rows) * out.output.view.cols * wtype_size(out.output.view.type);
  out.bytes_per_step += out_bytes + out.output_norm.bytes();
  out.bytes = device_weight_bytes(w, c);
  return out;
}

}  // namespace fdl::cuda
