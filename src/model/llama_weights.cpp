// Binding and validation of Llama tensors (see llama_weights.h).
#include "model/llama_weights.h"

#include <cmath>
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
        fail("tensor '" + t.name + "' is not used by the llama model plan (a bias, an expert or another " +
             "architecture's tensor): refusing to run without it");
  }

  /// A matrix of `rows` rows of `cols` (ggml ne = {cols, rows}).
  cpu::WeightMatrix matrix(const std::string& name, int64_t cols, int64_t rows) {
    const GgufTensorInfo& t = find(name);
    if (t.n_dims != 2 || t.ne[0] != uint64_t(cols) || t.ne[1] != uint64_t(rows))
      fail("tensor '" + name + "' has shape " + shape_str(t) + ", expected [" +
           std::to_string(cols) + ", " + std::to_string(rows) + "] (ggml order: n_in, n_out)");
    if (!is_supported_weight_type(t.type()))
      fail("tensor '" + name + "' has unsupported type " + ggml_type_name(t.type_id) +
           "; supported weight types: " + std::string(supported_weight_types()));
    try {
      // Also rejects a Q8_0 row width that is not a whole number of blocks.
      if (cpu::weight_row_bytes(t.type(), cols) * size_t(rows) != t.n_bytes)
        fail("tensor '" + name + "' holds " + std::to_string(t.n_bytes) + " bytes, not the " +
             std::to_string(rows) + " rows its shape and type imply");
    } catch (const std::invalid_argument& e) {
      fail("tensor '" + name + "': " + e.what());
    }
    return cpu::WeightMatrix{t.type(), t.data, rows, cols};
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
    L.wq = b.matrix(p + "attn_q.weight", d, q);
    L.wk = b.matrix(p + "attn_k.weight", d, kv);
    L.wv = b.matrix(p + "attn_v.weight", d, kv);
    L.wo = b.matrix(p + "attn_output.weight", q, d);
    L.ffn_norm = b.vector(p + "ffn_norm.weight", d);
    L.w_gate = b.matrix(p + "ffn_gate.weight", d, ff);
    L.w_up = b.matrix(p + "ffn_up.weight", d, ff);
    L.w_down = b.matrix(p + "ffn_down.weight", ff, d);
  }
  if (f.find_tensor("rope_freqs.weight")) {
    const float* factors = b.vector("rope_freqs.weight", c.rope_dim / 2);
    w.rope_freq_factors.assign(factors, factors + c.rope_dim / 2);
    for (float x : w.rope_freq_factors)
      if (!(x > 0) || !std::isfinite(x))
        b.fail("tensor 'rope_freqs.weight' holds a non-positive or non-finite factor");
  } else if (c.rope_llama3) {
    w.rope_freq_factors = llama3_rope_factors(c);
  }
  b.check_all_used();
  return w;
}

}  // namespace fdl
