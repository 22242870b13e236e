// Binding and validation of Llama tensors (see llama_weights.h).
#include "model/llama_weights.h"

#include <cmath>
#include <cstring>
#include <numbers>
#include <string>
#include <unordered_set>

namespace fdl {
namespace {

std::string shape_str(const GgufTensorInfo& t) {
  std::string s = "[";
  for (uint32_t i = 0; i < t.n_dims; ++i) s += (i ? ", " : "") + std::to_string(t.ne[i]);
  return s + "]";
}

class Binder {
 public:
  Binder(const GgufFile& f, LlamaWeights& w) : f_(f), w_(w) {}

  [[noreturn]] void fail(const std::string& what) const { throw ModelError(f_.path() + ": " + what); }

  const GgufTensorInfo& find(const std::string& name) {
    const GgufTensorInfo* t = f_.find_tensor(name);
    if (!t) fail("missing tensor '" + name + "'");
    used_.insert(name);
    return *t;
  }

  /// A tensor the plan does not read (a bias, an expert, another architecture's tensor) would
  /// mean the file describes other math than the one run: refused, never ignored.
  void check_all_used() const {
    for (const GgufTensorInfo& t : f_.tensors())
      if (!used_.count(t.name))
        fail("tensor '" + t.name + "' is not used by the " + f_.get_string_or("general.architecture", "?") +
             " model plan (a bias, an expert or another " +
             "architecture's tensor): refusing to run the model without it");
  }

  /// A matrix of `rows` rows of `cols` (ggml ne = {cols, rows}); with `stack` > 0, a 3-D tensor
  /// of `stack` such matrices (ne = {cols, rows, stack}: llama.cpp's expert tensors) as one
  /// matrix of stack * rows rows.
  cpu::WeightMatrix matrix(const std::string& name, int64_t cols, int64_t rows, int64_t stack = 0) {
    const GgufTensorInfo& t = find(name);
    const bool shape_ok = stack > 0 ? t.n_dims == 3 && t.ne[2] == uint64_t(stack) : t.n_dims == 2;
    if (!shape_ok || t.ne[0] != uint64_t(cols) || t.ne[1] != uint64_t(rows))
      fail("tensor '" + name + "' has shape " + shape_str(t) + ", expected [" + std::to_string(cols) + ", " +
           std::to_string(rows) + (stack > 0 ? ", " + std::to_string(stack) : "") + "] (ggml order: n_in, n_out" +
           (stack > 0 ? ", expert" : "") + ")");
    if (stack > 0) rows *= stack;
    if (!is_supported_weight_type(t.type()))
      fail("tensor '" + name + "' has unsupported type " + ggml_type_name(t.type_id) +
           "; supported weight types: " + std::string(supported_weight_types()));
    try {
      // Also rejects a row width that is not a whole number of the type's blocks.
      if (cpu::weight_row_bytes(t.type(), cols) * size_t(rows) != t.n_bytes)
        fail("tensor '" + name + "' holds " + std::to_string(t.n_bytes) + " bytes, not the " +
             std::to_string(rows) + " rows its shape and type imply");
    } catch (const std::invalid_argument& e) {
      fail("tensor '" + name + "': " + e.what());
    }
    return cpu::WeightMatrix{t.type(), t.data, rows, cols};
  }

  /// matrix(), with the rows of every head of `head_rows` rows reordered from half-split to
  /// interleaved RoPE pairs (a copy; whole rows move, so any row type works).
  cpu::WeightMatrix matrix_halves_to_pairs(const cpu::WeightMatrix& m, int64_t head_rows, int64_t rope_dim) {
    const int64_t rows = m.rows;
    const size_t row_bytes = cpu::weight_row_bytes(m.type, m.cols);
    constexpr size_t kAlign = 64;  // a cache line: vector loads of a row start never straddle two
    std::vector<uint8_t>& buf = w_.owned_rows.emplace_back(row_bytes * size_t(rows) + kAlign);
    uint8_t* dst = buf.data() + (kAlign - reinterpret_cast<uintptr_t>(buf.data()) % kAlign) % kAlign;
    const auto* src = static_cast<const uint8_t*>(m.data);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t head = r / head_rows, e = r % head_rows;
      std::memcpy(dst + size_t(r) * row_bytes, src + size_t(head * head_rows + halves_source_dim(e, rope_dim)) * row_bytes,
                  row_bytes);
    }
    return cpu::WeightMatrix{m.type, dst, rows, m.cols};
  }

  /// Rows [first, first + count) of `m`, as a view (a fused matrix's part).
  static cpu::WeightMatrix rows_of(const cpu::WeightMatrix& m, int64_t first, int64_t count) {
    const size_t row_bytes = cpu::weight_row_bytes(m.type, m.cols);
    return cpu::WeightMatrix{m.type, static_cast<const uint8_t*>(m.data) + size_t(first) * row_bytes, count, m.cols};
  }

  /// vector(), reordered like matrix_halves_to_pairs when `head_len` > 0.
  const float* vector_halves_to_pairs(const std::string& name, int64_t n, int64_t head_len, int64_t rope_dim) {
    const float* v = vector(name, n);
    if (head_len <= 0) return v;
    std::vector<float>& dst = w_.owned.emplace_back(size_t(n));
    for (int64_t i = 0; i < n; ++i) dst[size_t(i)] = v[i / head_len * head_len + halves_source_dim(i % head_len, rope_dim)];
    return dst.data();
  }

  /// A vector of `n` RoPE frequency divisors, each positive and finite (a copy).
  std::vector<float> rope_factors(const std::string& name, int64_t n) {
    const float* v = vector(name, n);
    for (int64_t i = 0; i < n; ++i)
      if (!(v[i] > 0) || !std::isfinite(v[i]))
        fail("tensor '" + name + "' holds a non-positive or non-finite factor (" + std::to_string(v[i]) +
             " at index " + std::to_string(i) + ")");
    return std::vector<float>(v, v + n);
  }

  /// A vector of `n` floats; F32 is used in place, F16/BF16 are widened once.
  const float* vector(const std::string& name, int64_t n) {
    const GgufTensorInfo& t = find(name);
    if (t.n_dims != 1 || t.ne[0] != uint64_t(n))
      fail("tensor '" + name + "' has shape " + shape_str(t) + ", expected [" + std::to_string(n) + "]");
    switch (t.type()) {
      case GgmlType::F32:
        return reinterpret_cast<const float*>(t.data);
      case GgmlType::F16:
      case GgmlType::BF16: {
        std::vector<float>& dst = w_.owned.emplace_back(size_t(n));
        dequantize_row(t.type(), t.data, dst.data(), size_t(n));
        return dst.data();
      }
      default:
        fail("tensor '" + name + "' has unsupported type " + ggml_type_name(t.type_id) +
             " for a vector; supported: F32, F16, BF16");
    }
  }

 private:
  const GgufFile& f_;
  LlamaWeights& w_;
  std::unordered_set<std::string> used_;
};

}  // namespace

std::vector<float> llama3_rope_factors(const ModelConfig& c) {
  const int n_pairs = c.rope_dim / 2;
  const double low_wavelen = double(c.rope_orig_ctx) / c.rope_low_freq_factor;
  const double high_wavelen = double(c.rope_orig_ctx) / c.rope_high_freq_factor;
  std::vector<float> factors(static_cast<size_t>(n_pairs));
  for (int i = 0; i < n_pairs; ++i) {
    const double freq = std::pow(double(c.rope_freq_base), -2.0 * i / c.rope_dim);
    const double wavelen = 2 * std::numbers::pi / freq;
    double factor;
    if (wavelen < high_wavelen) {
      factor = 1.0;
    } else if (wavelen > low_wavelen) {
      factor = c.rope_scale_factor;
    } else {
      const double smooth = (c.rope_orig_ctx / wavelen - c.rope_low_freq_factor) /
                            (c.rope_high_freq_factor - c.rope_low_freq_factor);
      factor = 1.0 / ((1 - smooth) / c.rope_scale_factor + smooth);
    }
    factors[size_t(i)] = float(factor);
  }
  return factors;
}

cpu::RopeParams global_rope_params(const ModelConfig& c, const LlamaWeights& w, int n_ctx) {
  cpu::RopeParams p;
  p.head_dim = c.head_dim;
  p.rope_dim = c.rope_dim;
  p.freq_base = c.rope_freq_base;
  p.freq_scale = c.rope_freq_scale;
  p.attn_factor = c.rope_attn_factor;
  if (c.rope_longrope)
    p.freq_factors = c.rope_long_factors(n_ctx) ? w.rope_factors_long : w.rope_factors_short;
  else
    p.freq_factors = w.rope_freq_factors;
  if (c.rope_yarn) cpu::set_yarn(p, c.rope_orig_ctx, c.yarn_beta_fast, c.yarn_beta_slow);
  return p;
}

LlamaWeights bind_llama_weights(const GgufFile& f, const ModelConfig& c) {
  LlamaWeights w;
  Binder b(f, w);
  const int64_t d = c.n_embd, q = int64_t(c.n_head) * c.head_dim,
                kv = int64_t(c.n_head_kv) * c.head_dim, ff = c.n_ff;
  w.token_embd = b.matrix("token_embd.weight", d, c.n_vocab);
  w.output_norm = b.vector("output_norm.weight", d);
  w.output = c.tied_output ? w.token_embd : b.matrix("output.weight", d, c.n_vocab);
  w.layers.resize(size_t(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LlamaLayerWeights& L = w.layers[size_t(l)];
    L.attn_norm = b.vector(p + "attn_norm.weight", d);
    if (c.fused_qkv) {  // phi3: one [q | k | v] matrix, bound as three row ranges
      const cpu::WeightMatrix qkv = b.matrix(p + "attn_qkv.weight", d, q + 2 * kv);
      L.wq = Binder::rows_of(qkv, 0, q);
      L.wk = Binder::rows_of(qkv, q, kv);
      L.wv = Binder::rows_of(qkv, q + kv, kv);
    } else {
      L.wq = b.matrix(p + "attn_q.weight", d, q);
      L.wk = b.matrix(p + "attn_k.weight", d, kv);
      L.wv = b.matrix(p + "attn_v.weight", d, kv);
    }
    // Q/K rows (and their biases and norms) with interleaved RoPE pairs, whatever the file keeps.
    const int64_t hd = c.head_dim, rd = c.rope_dim, reorder = c.rope_halves ? hd : 0;
    if (reorder) {
      L.wq = b.matrix_halves_to_pairs(L.wq, hd, rd);
      L.wk = b.matrix_halves_to_pairs(L.wk, hd, rd);
    }
    if (c.qkv_bias) {
      L.bq = b.vector_halves_to_pairs(p + "attn_q.bias", q, reorder, rd);
      L.bk = b.vector_halves_to_pairs(p + "attn_k.bias", kv, reorder, rd);
      L.bv = b.vector(p + "attn_v.bias", kv);
    }
    if (c.qk_norm) {
      L.q_norm = b.vector_halves_to_pairs(p + "attn_q_norm.weight", hd, reorder, rd);
      L.k_norm = b.vector_halves_to_pairs(p + "attn_k_norm.weight", hd, reorder, rd);
    }
    L.wo = b.matrix(p + "attn_output.weight", q, d);
    L.ffn_norm = b.vector(p + "ffn_norm.weight", d);
    if (c.n_expert > 0) {  // Mixtral: a router and n_expert FFNs in 3-D tensors
      L.router = b.matrix(p + "ffn_gate_inp.weight", d, c.n_expert);
      const cpu::WeightMatrix gate = b.matrix(p + "ffn_gate_exps.weight", d, ff, c.n_expert);
      const cpu::WeightMatrix up = b.matrix(p + "ffn_up_exps.weight", d, ff, c.n_expert);
      const cpu::WeightMatrix down = b.matrix(p + "ffn_down_exps.weight", ff, d, c.n_expert);
      for (int e = 0; e < c.n_expert; ++e)
        L.experts.push_back(ExpertWeights{Binder::rows_of(gate, e * ff, ff), Binder::rows_of(up, e * ff, ff),
                                          Binder::rows_of(down, e * d, d)});
    } else if (c.fused_gate_up) {  // phi3: ffn_up holds [gate | up]
      const cpu::WeightMatrix gate_up = b.matrix(p + "ffn_up.weight", d, 2 * ff);
      L.w_gate = Binder::rows_of(gate_up, 0, ff);
      L.w_up = Binder::rows_of(gate_up, ff, ff);
    } else {
      L.w_gate = b.matrix(p + "ffn_gate.weight", d, ff);
      L.w_up = b.matrix(p + "ffn_up.weight", d, ff);
    }
    if (c.n_expert == 0) L.w_down = b.matrix(p + "ffn_down.weight", ff, d);
    if (c.post_norms) {
      L.post_attn_norm = b.vector(p + "post_attention_norm.weight", d);
      L.post_ffn_norm = b.vector(p + "post_ffw_norm.weight", d);
    }
  }
  if (f.find_tensor("rope_freqs.weight")) {
    w.rope_freq_factors = b.rope_factors("rope_freqs.weight", c.rope_dim / 2);
  } else if (c.rope_llama3) {
    w.rope_freq_factors = llama3_rope_factors(c);
  }
  if (c.rope_longrope) {  // ModelConfig::from_gguf saw both tensors
    w.rope_factors_long = b.rope_factors("rope_factors_long.weight", c.rope_dim / 2);
    w.rope_factors_short = b.rope_factors("rope_factors_short.weight", c.rope_dim / 2);
  }
  b.check_all_used();
  return w;
}

}  // namespace fdl
