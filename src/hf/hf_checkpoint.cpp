// A Hugging Face model directory as an in-memory GGUF (see hf_checkpoint.h).
#include "hf/hf_checkpoint.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "flashdllm/dtype.h"
#include "hf/hf_config.h"
#include "hf/hf_tokenizer.h"
#include "hf/safetensors.h"

namespace fdl::hf {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The largest JSON file read (tokenizer.json of a 256k vocabulary is ~35 MB).
constexpr uintmax_t kMaxJsonBytes = uintmax_t(256) << 20;

json read_json(const fs::path& path, bool required) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    if (!required) return json();
    throw HfError(path.string() + ": does not exist");
  }
  // A FIFO or a device would block or never end: regular files only.
  if (fs::is_directory(st)) throw HfError(path.string() + ": is a directory, expected a JSON file");
  if (!fs::is_regular_file(st)) throw HfError(path.string() + ": is not a regular file");
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) throw HfError(path.string() + ": cannot stat (" + ec.message() + ")");
  if (size == 0) throw HfError(path.string() + ": is empty");
  if (size > kMaxJsonBytes)
    throw HfError(path.string() + ": " + std::to_string(size) + " bytes, above the limit of " +
                  std::to_string(kMaxJsonBytes) + " for a JSON file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw HfError(path.string() + ": cannot open (" + std::strerror(errno) + ")");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const json::exception& e) {
    throw HfError(path.string() + ": not valid JSON: " + e.what());
  }
}

std::string shape_str(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// One GGUF tensor and where its bytes come from.
struct Binding {
  std::string gguf_name;
  const SafetensorsTensor* src;
  std::vector<uint64_t> hf_shape;  ///< expected, outermost first
  int permute_heads = 0;           ///< > 0: reorder rows from rotate-half to interleaved pairs
  float add = 0.f;                 ///< added to every element of a 1-D tensor (Gemma's norms: 1)
  /// More sources stacked after `src` as a 3-D tensor (Mixtral's experts: llama.cpp's layout).
  std::vector<const SafetensorsTensor*> more;
};

class Mapper {
 public:
  Mapper(const SafetensorsCheckpoint& ckpt, const fs::path& dir, std::string family)
      : ckpt_(ckpt), dir_(dir), family_(std::move(family)) {}

  /// An RMSNorm weight: Gemma checkpoints store scale - 1 (the GGUF holds the scale, as
  /// llama.cpp's converter writes it).
  void bind_norm(const std::string& hf_name, std::string gguf_name, uint64_t n, bool minus_one) {
    bind(hf_name, std::move(gguf_name), {n});
    bindings_.back().add = minus_one ? 1.f : 0.f;
  }
  void bind(const std::string& hf_name, std::string gguf_name, std::vector<uint64_t> shape, int permute_heads = 0) {
    const SafetensorsTensor* t = ckpt_.find(hf_name);
    if (!t) throw HfError(dir_.string() + ": missing tensor '" + hf_name + "'");
    if (t->shape != shape)
      throw HfError(dir_.string() + ": tensor '" + hf_name + "' has shape " + shape_str(t->shape) + ", expected " +
                    shape_str(shape));
    if (t->dtype != "F32" && t->dtype != "F16" && t->dtype != "BF16")
      throw HfError(dir_.string() + ": tensor '" + hf_name + "' has dtype " + t->dtype +
                    " (supported: F32, F16, BF16)");
    used_.insert(hf_name);
    bindings_.push_back({std::move(gguf_name), t, std::move(shape), permute_heads, 0.f, {}});
  }
  /// The 2-D tensors hf_names[0..] (each `shape`, one dtype) as one GGUF tensor of
  /// hf_names.size() matrices (Mixtral's experts: ffn_*_exps).
  void bind_stacked(const std::vector<std::string>& hf_names, std::string gguf_name, std::vector<uint64_t> shape) {
    bind(hf_names[0], std::move(gguf_name), shape);
    const size_t at = bindings_.size() - 1;
    for (size_t i = 1; i < hf_names.size(); ++i) {
      bind(hf_names[i], "", shape);
      const SafetensorsTensor* t = bindings_.back().src;
      bindings_.pop_back();
      if (t->dtype != bindings_[at].src->dtype)
        throw HfError(dir_.string() + ": tensor '" + hf_names[i] + "' has dtype " + t->dtype + ", '" + hf_names[0] +
                      "' " + bindings_[at].src->dtype + " (experts must share one)");
      bindings_[at].more.push_back(t);
    }
    bindings_[at].hf_shape.insert(bindings_[at].hf_shape.begin(), uint64_t(hf_names.size()));
  }
  void skip(const std::string& hf_name) { used_.insert(hf_name); }

  /// Every checkpoint tensor must be bound or skipped on purpose.
  void check_all_used() const {
    for (const SafetensorsTensor* t : ckpt_.tensors()) {
      if (used_.count(t->name)) continue;
      if (t->name.size() >= 23 && t->name.ends_with("rotary_emb.inv_freq")) continue;  // a buffer, recomputed
      throw HfError(dir_.string() + ": tensor '" + t->name + "' is not used by the " + family_ + " model plan (" +
                    "a bias, an expert or another architecture's tensor): refusing to run the model without it");
    }
  }
  const std::vector<Binding>& bindings() const { return bindings_; }

 private:
  const SafetensorsCheckpoint& ckpt_;
  fs::path dir_;
  std::string family_;
  std::set<std::string> used_;
  std::vector<Binding> bindings_;
};

GgmlType ggml_type_of(const std::string& dtype) {
  if (dtype == "F16") return GgmlType::F16;
  if (dtype == "BF16") return GgmlType::BF16;
  return GgmlType::F32;
}

float element_as_f32(const std::string& dtype, const uint8_t* p) {
  if (dtype == "F32") {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return dtype == "F16" ? fp16_to_fp32(h) : bf16_to_fp32(h);
}

void add_tensor(GgufWriter& w, const Binding& b) {
  const SafetensorsTensor& t = *b.src;
  std::vector<uint64_t> ne(b.hf_shape.rbegin(), b.hf_shape.rend());  // ggml order: innermost first
  if (b.hf_shape.size() == 1) {
    const size_t elem = t.dtype == "F32" ? 4 : 2;
    w.add_tensor(b.gguf_name, GgmlType::F32, ne, [&t, elem, add = b.add](std::span<uint8_t> out) {
      for (size_t i = 0; i < t.n_elements(); ++i) {
        const float f = element_as_f32(t.dtype, t.data + i * elem) + add;
        std::memcpy(out.data() + 4 * i, &f, 4);
      }
    });
    return;
  }
  if (!b.more.empty()) {  // stacked experts, in order
    w.add_tensor(b.gguf_name, ggml_type_of(t.dtype), ne, [&b](std::span<uint8_t> out) {
      std::memcpy(out.data(), b.src->data, b.src->n_bytes);
      size_t at = b.src->n_bytes;
      for (const SafetensorsTensor* m : b.more) {
        std::memcpy(out.data() + at, m->data, m->n_bytes);
        at += m->n_bytes;
      }
    });
    return;
  }
  if (b.permute_heads == 0) {
    w.add_tensor(b.gguf_name, ggml_type_of(t.dtype), ne,
                 [&t](std::span<uint8_t> out) { std::memcpy(out.data(), t.data, t.n_bytes); });
    return;
  }
  const size_t rows = b.hf_shape[0], row_bytes = t.n_bytes / rows;
  const size_t head_rows = rows / size_t(b.permute_heads), half = head_rows / 2;
  w.add_tensor(b.gguf_name, ggml_type_of(t.dtype), ne, [&t, rows, row_bytes, head_rows, half](std::span<uint8_t> out) {
    for (size_t r = 0; r < rows; ++r) {
      const size_t head = r / head_rows, in_head = r % head_rows;
      const size_t src = head * head_rows + (in_head % 2) * half + in_head / 2;
      std::memcpy(out.data() + r * row_bytes, t.data + src * row_bytes, row_bytes);
    }
  });
}

}  // namespace

bool is_hf_directory(const fs::path& path) {
  // config.json of any kind (a FIFO, a device) makes it one: reading it then says what is wrong.
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::symlink_status(path / "config.json", ec));
}

GgufFile open_hf_directory(const fs::path& dir) {
  if (!is_hf_directory(dir))
    throw HfError(dir.string() + ": not a Hugging Face model directory (no config.json in it)");
  const json config = read_json(dir / "config.json", true);
  GgufWriter w;
  // A value of an unexpected JSON type deep in a file surfaces as json::exception: named here.
  const auto named = [](const fs::path& file, auto&& step) {
    try {
      return step();
    } catch (const json::exception& e) {
      throw HfError(file.string() + ": unexpected value: " + e.what());
    }
  };
  const HfModelShape s =
      named(dir / "config.json", [&] { return write_model_metadata(config, (dir / "config.json").string(), w); });
  w.set_string("general.name", dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string());

  // The weights first: their shapes bound what config.json may claim (vocab_size sizes the
  // tokenizer's tables below).
  const SafetensorsCheckpoint ckpt = SafetensorsCheckpoint::open(dir);
  Mapper m(ckpt, dir, std::string(s.family->name));
  const uint64_t d = uint64_t(s.n_embd), q = uint64_t(s.n_head) * uint64_t(s.head_dim),
                 kv = uint64_t(s.n_head_kv) * uint64_t(s.head_dim), ff = uint64_t(s.n_ff), v = uint64_t(s.n_vocab);
  m.bind("model.embed_tokens.weight", "token_embd.weight", {v, d});
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string hf = "model.layers." + std::to_string(l) + ".", gg = "blk." + std::to_string(l) + ".";
    const bool minus_one = s.family->hf_norm_minus_one;
    m.bind_norm(hf + "input_layernorm.weight", gg + "attn_norm.weight", d, minus_one);
    // HF keeps RoPE pairs in halves; the family's GGUF layout is what the model reads
    // (llama.cpp's converter reorders llama's rows to interleaved pairs and keeps qwen's).
    const bool to_pairs = s.family->gguf_rope_pairs == arch::RopePairs::Interleaved;
    if (s.family->fused_qkv) {  // kept fused, in HF's layout, as llama.cpp's converter does
      m.bind(hf + "self_attn.qkv_proj.weight", gg + "attn_qkv.weight", {q + 2 * kv, d});
    } else {
      m.bind(hf + "self_attn.q_proj.weight", gg + "attn_q.weight", {q, d}, to_pairs ? s.n_head : 0);
      m.bind(hf + "self_attn.k_proj.weight", gg + "attn_k.weight", {kv, d}, to_pairs ? s.n_head_kv : 0);
      m.bind(hf + "self_attn.v_proj.weight", gg + "attn_v.weight", {kv, d});
    }
    if (s.family->qkv_bias) {
      m.bind(hf + "self_attn.q_proj.bias", gg + "attn_q.bias", {q});
      m.bind(hf + "self_attn.k_proj.bias", gg + "attn_k.bias", {kv});
      m.bind(hf + "self_attn.v_proj.bias", gg + "attn_v.bias", {kv});
    }
    if (s.family->qk_norm) {
      m.bind_norm(hf + "self_attn.q_norm.weight", gg + "attn_q_norm.weight", uint64_t(s.head_dim), minus_one);
      m.bind_norm(hf + "self_attn.k_norm.weight", gg + "attn_k_norm.weight", uint64_t(s.head_dim), minus_one);
    }
    m.bind(hf + "self_attn.o_proj.weight", gg + "attn_output.weight", {d, q});
    if (s.family->post_norms) {  // Gemma: post_attention_layernorm follows attention; a pre-FFN norm of its own
      m.bind_norm(hf + "post_attention_layernorm.weight", gg + "post_attention_norm.weight", d, minus_one);
      m.bind_norm(hf + "pre_feedforward_layernorm.weight", gg + "ffn_norm.weight", d, minus_one);
      m.bind_norm(hf + "post_feedforward_layernorm.weight", gg + "post_ffw_norm.weight", d, minus_one);
    } else {
      m.bind(hf + "post_attention_layernorm.weight", gg + "ffn_norm.weight", {d});
    }
    if (s.n_expert > 0) {  // Mixtral: w1 = gate, w3 = up, w2 = down per expert, stacked
      m.bind(hf + "block_sparse_moe.gate.weight", gg + "ffn_gate_inp.weight", {uint64_t(s.n_expert), d});
      const auto experts = [&](const char* part) {
        std::vector<std::string> names;
        for (int e = 0; e < s.n_expert; ++e)
          names.push_back(hf + "block_sparse_moe.experts." + std::to_string(e) + "." + part + ".weight");
        return names;
      };
      m.bind_stacked(experts("w1"), gg + "ffn_gate_exps.weight", {ff, d});
      m.bind_stacked(experts("w3"), gg + "ffn_up_exps.weight", {ff, d});
      m.bind_stacked(experts("w2"), gg + "ffn_down_exps.weight", {d, ff});
    } else if (s.family->fused_gate_up) {
      m.bind(hf + "mlp.gate_up_proj.weight", gg + "ffn_up.weight", {2 * ff, d});
    } else {
      m.bind(hf + "mlp.gate_proj.weight", gg + "ffn_gate.weight", {ff, d});
      m.bind(hf + "mlp.up_proj.weight", gg + "ffn_up.weight", {ff, d});
    }
    if (s.n_expert == 0) m.bind(hf + "mlp.down_proj.weight", gg + "ffn_down.weight", {d, ff});
  }
  m.bind_norm("model.norm.weight", "output_norm.weight", d, s.family->hf_norm_minus_one);
  if (!s.tied_output)
    m.bind("lm_head.weight", "output.weight", {v, d});
  else if (ckpt.find("lm_head.weight"))
    m.skip("lm_head.weight");  // tied: the embedding is the output matrix
  m.check_all_used();

  std::error_code gen_ec;
  if (fs::exists(fs::symlink_status(dir / "generation_config.json", gen_ec)))
    named(dir / "generation_config.json", [&] {
      write_sampling_defaults(read_json(dir / "generation_config.json", true), (dir / "generation_config.json").string(), w);
    });
  const json tokenizer = read_json(dir / "tokenizer.json", true);
  json tokenizer_config = read_json(dir / "tokenizer_config.json", false);
  // Newer repositories keep the chat template in its own file: it counts as the config's.
  std::error_code tmpl_ec;
  if ((tokenizer_config.is_null() || (tokenizer_config.is_object() && !tokenizer_config.contains("chat_template"))) &&
      fs::is_regular_file(dir / "chat_template.jinja", tmpl_ec)) {
    std::ifstream in(dir / "chat_template.jinja", std::ios::binary);
    if (tokenizer_config.is_null()) tokenizer_config = json::object();
    tokenizer_config["chat_template"] = std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  named(dir / "tokenizer.json", [&] {
    write_tokenizer_metadata(tokenizer, tokenizer_config, config, s.n_vocab, (dir / "tokenizer.json").string(),
                             (dir / "tokenizer_config.json").string(), w);
  });
  // LongRoPE's factors first, as llama.cpp's converter writes them (F32, rope_dim/2 each).
  for (const auto& [name, list] : {std::pair{"rope_factors_long.weight", &s.rope_factors_long},
                                   std::pair{"rope_factors_short.weight", &s.rope_factors_short}}) {
    const std::vector<float>* factors = list;
    if (!factors->empty())
      w.add_tensor(name, GgmlType::F32, {factors->size()},
                   [factors](std::span<uint8_t> out) { std::memcpy(out.data(), factors->data(), out.size()); });
  }
  for (const Binding& b : m.bindings()) add_tensor(w, b);
  return GgufFile::from_bytes(w.to_bytes(dir.string()), dir.string());
}

}  // namespace fdl::hf
