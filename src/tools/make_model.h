// tools/make_model.h — writes random-weight GGUF files of the llama, qwen2 and qwen3 families,
// of any shape and weight type, for benchmarks and tests that need big models without
// downloading any.
//
// The file follows llama.cpp's conventions so both llama.cpp and flashdllm load it (shown for
// llama; qwen2/qwen3 files use their own key prefix and add blk.N.attn_{q,k,v}.bias (F32,
// values of std 0.02 around 0) / blk.N.attn_{q,k}_norm.weight {head_dim} (F32 near 1)):
//  - metadata: general.architecture = "llama", general.name, general.file_type (llama.cpp's
//    LLAMA_FTYPE numbering: llama_file_type below), general.quantization_version = 2 for the
//    block-quantized types, and llama.{context_length, embedding_length,
//    block_count, feed_forward_length, attention.head_count, attention.head_count_kv,
//    rope.dimension_count, rope.freq_base, attention.layer_norm_rms_epsilon, vocab_size};
//  - tensors (ggml dims, ne[0] innermost): token_embd.weight {dim, vocab},
//    output_norm.weight {dim}, output.weight {dim, vocab} (absent when tied), and per layer N
//    blk.N.{attn_norm {dim}, attn_q {dim, dim}, attn_k {dim, kv_dim}, attn_v {dim, kv_dim},
//    attn_output {dim, dim}, ffn_norm {dim}, ffn_gate {dim, ffn}, ffn_up {dim, ffn},
//    ffn_down {ffn, dim}}.weight, with kv_dim = n_kv_heads * dim / n_heads;
//  - norm weights are F32 near 1 (1 + uniform noise of std 0.02); matrices are in the chosen
//    type with uniform random values of std `weight_std` (0.02 keeps activations sane);
//  - a `llama` (SentencePiece-style) tokenizer: copied from `vocab_from` (every
//    tokenizer.ggml.* key; the vocab size then follows that file), or synthesized:
//    <unk> (UNKNOWN), <s> (CONTROL), </s> (CONTROL), the 256 byte pieces <0x00>..<0xFF> (BYTE),
//    then unique filler pieces ("▁", letters, "▁"-prefixed letter strings ...) of type NORMAL
//    with decreasing scores, exactly n_vocab entries.
//
// Values are a pure function of (seed, tensor, position): the same options always give the
// same bytes, whatever the thread count. Tensors are filled in parallel in fixed-size chunks
// and streamed through GgufWriter (atomic temp file + rename), so memory stays at about one
// tensor and a llama3-8b F16 file (16 GB) is written at disk speed.
//
// Errors: invalid options throw std::invalid_argument naming the option (e.g. "make_model:
// dim 100 is not divisible by n_heads 3"); I/O failures and a bad vocab_from file throw
// fdl::GgufError.
// Thread-safety: make_model may run concurrently for different outputs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flashdllm/dtype.h"

namespace fdl::tools {

/// Options for make_model. Every shape field left unset takes the preset's value.
struct MakeModelOptions {
  std::filesystem::path output;  ///< GGUF file to write (required)
  std::string preset = "tiny";   ///< one of model_presets()
  /// Type of the 2-D weight matrices (embeddings and output included): F32, F16, BF16 or a
  /// block-quantized type (writable_dtype_names()); those need dim, ffn_dim and
  /// n_heads x head_dim to be multiples of the type's block (32; 256 for the K-quants).
  GgmlType dtype = GgmlType::F16;
  /// llama.cpp's "_M" mix of dtype Q4_K or Q5_K (Q4_K_M, Q5_K_M; dense models only), as its
  /// llama-quantize chooses per tensor: output Q6_K; attn_v and ffn_down Q6_K in the layers
  /// where it spends more bits (the first and last eighth, and every third between), and for
  /// Q4_K_M with 80 layers (its 70B class) attn_v Q5_K in the others; the rest dtype.
  bool medium_mix = false;
  uint64_t seed = 42;  ///< PRNG seed; same seed + options = identical file
  /// Copy the tokenizer (all tokenizer.ggml.* keys) from this GGUF file, e.g. a llama.cpp
  /// vocab file; n_vocab is then that vocab's size (setting `vocab` to another value is an
  /// error). Unset: synthesize a SentencePiece-style vocab of `vocab` entries.
  std::optional<std::filesystem::path> vocab_from;

  // Shape overrides (unset = preset value).
  std::optional<uint32_t> dim;         ///< embedding length (n_embd)
  std::optional<uint32_t> n_layers;    ///< block count
  std::optional<uint32_t> n_heads;     ///< attention heads; must divide dim
  std::optional<uint32_t> n_kv_heads;  ///< KV heads (GQA); must divide n_heads
  std::optional<uint32_t> ffn_dim;     ///< feed-forward hidden size
  std::optional<uint32_t> vocab;       ///< vocab size; synthesized vocabs need >= 260
  std::optional<uint32_t> context;     ///< llama.context_length (tokens)
  std::optional<float> rope_theta;     ///< llama.rope.freq_base
  std::optional<float> rms_eps;        ///< llama.attention.layer_norm_rms_epsilon
  std::optional<std::string> arch;     ///< family: llama, qwen2, qwen3, gemma2 (keys and tensors follow it)
  /// A Mixtral-style mixture of experts: n_expert FFNs of ffn_dim per layer (llama.cpp's 3-D
  /// expert tensors and an F32 router), n_expert_used of them per token. Unset: the preset's
  /// (0: a dense FFN).
  std::optional<uint32_t> n_expert, n_expert_used;

  float weight_std = 0.02f;     ///< standard deviation of matrix values
  bool tied_embeddings = false;  ///< omit output.weight (the model reuses token_embd)
  std::string name;              ///< general.name; empty = "flashdllm-random-<preset>"
  unsigned threads = 0;          ///< fill threads; 0 = std::thread::hardware_concurrency()
};

/// A fully resolved model shape (preset + overrides), as written to the file.
struct ModelShape {
  uint32_t dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, ffn_dim = 0, vocab = 0,
           context = 0;
  float rope_theta = 10000.f;
  float rms_eps = 1e-5f;
  /// general.architecture: llama, qwen2 (Q/K/V biases), qwen3 (Q/K norms) or gemma2 (post-norms,
  /// soft-caps 50 / 30, a 4096-position window on every other layer)
  std::string arch = "llama";
  uint32_t head_dim_set = 0;  ///< attention.key_length when it is not dim / n_heads (Gemma 2: 256); 0 = that
  uint32_t n_expert = 0, n_expert_used = 0;  ///< experts per layer and per token; 0 = a dense FFN
  uint32_t head_dim() const { return head_dim_set ? head_dim_set : dim / n_heads; }
  uint32_t q_dim() const { return n_heads * head_dim(); }
  uint32_t kv_dim() const { return n_kv_heads * head_dim(); }
};

/// Names of the built-in presets: "tiny", "110m", "llama-7b", "llama3-8b", "llama3-70b", "qwen2-7b",
/// "qwen3-8b", "gemma2-9b", "mixtral-8x7b".
std::vector<std::string> model_presets();

/// The shape `make_model(opt)` would write, validated (throws std::invalid_argument naming the
/// bad option, e.g. an unknown preset or a dim not divisible by n_heads). With `vocab_from`
/// set, `vocab` is that file's vocab size (the file is opened to read it).
ModelShape resolve_model_shape(const MakeModelOptions& opt);

/// Total bytes of tensor data make_model(opt) writes (excluding metadata).
uint64_t model_tensor_bytes(const MakeModelOptions& opt);

/// Write the model described by `opt` to `opt.output`. See the file comment for the layout.
void make_model(const MakeModelOptions& opt);

/// The weight types make_model writes, as typed on a command line, comma-separated: f32, f16,
/// bf16, and the block-quantized q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k
/// (quantize_row's round-to-nearest quantizers, flashdllm/dtype.h).
std::string writable_dtype_names();

/// Parse a weight type name as typed on a command line (writable_dtype_names(),
/// case-insensitive). Throws std::invalid_argument listing the accepted names.
GgmlType parse_weight_dtype(std::string_view name);

/// A --dtype value: one type for every matrix, or a mix (q4_k_m, q5_k_m: MakeModelOptions::
/// medium_mix of Q4_K / Q5_K). Case-insensitive; throws std::invalid_argument listing the
/// accepted names.
struct WeightSpec {
  GgmlType type = GgmlType::F16;
  bool medium_mix = false;
};
WeightSpec parse_weight_spec(std::string_view name);

/// The type make_model writes for a matrix of layer `layer` (of n_layers) given opt.dtype and
/// opt.medium_mix: `role` is "output", "attn_v", "ffn_down" or any other tensor's name.
GgmlType matrix_type(const MakeModelOptions& opt, std::string_view role, uint32_t layer, uint32_t n_layers);

/// llama.cpp's general.file_type (LLAMA_FTYPE) for a file whose matrices are all of one type:
/// F32 0, F16 1, Q4_0 2, Q4_1 3, Q8_0 7, Q5_0 8, Q5_1 9, Q2_K 10, and the K-quants' "_S"
/// numbers Q3_K 11, Q4_K 14, Q5_K 16, Q6_K 18; BF16 32.
uint32_t llama_file_type(GgmlType dtype);
/// ... and for the file make_model(opt) writes: with medium_mix, Q4_K_M 15 or Q5_K_M 17.
uint32_t llama_file_type(const MakeModelOptions& opt);

}  // namespace fdl::tools
