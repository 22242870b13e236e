// Internal pieces of the model maker, split out so each can be tested on its own.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "flashdllm/gguf.h"
#include "tools/make_model.h"

namespace fdl::tools {

/// 3 specials + 256 byte pieces + at least one filler piece.
inline constexpr uint32_t kMinSyntheticVocab = 260;

/// Preset + overrides, validated; `file_vocab` is the vocab size of a vocab_from file.
ModelShape resolve_shape(const MakeModelOptions& opt, std::optional<uint32_t> file_vocab);

/// Number of entries of tokenizer.ggml.tokens; throws GgufError if the file has none.
uint32_t vocab_size_of(const GgufFile& vocab_file);

/// A SentencePiece-style (`llama`) vocab of exactly n_vocab entries (see make_model.h).
struct SyntheticVocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> token_types;
};
SyntheticVocab synthesize_spm_vocab(uint32_t n_vocab);

/// One tensor the model maker writes: name, type, ggml dims, and how to fill it.
struct TensorPlan {
  std::string name;
  GgmlType type;
  std::vector<uint64_t> ne;
  float mean;  ///< 1 for norm weights, 0 for matrices
  float std;
};
/// The Llama tensor list for `shape`, in file order.
std::vector<TensorPlan> llama_tensor_list(const ModelShape& shape, const MakeModelOptions& opt);
uint64_t tensor_bytes(const TensorPlan& t);

/// Fill `out` (the bytes of `n_elements` values of `type`) with uniform random values of the
/// given mean and standard deviation. Deterministic in (seed, stream, element index) whatever
/// `threads` is: the tensor is cut into fixed chunks, each with its own PRNG state.
void fill_random(std::span<uint8_t> out, GgmlType type, uint64_t n_elements, float mean,
                 float std, uint64_t seed, uint64_t stream, unsigned threads);

}  // namespace fdl::tools
