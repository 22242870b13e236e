// Tokenizer::from_gguf: picks the tokenizer model from `tokenizer.ggml.model` and sets the
// defaults llama.cpp uses for it before the metadata overrides are read.
#include "flashdllm/gguf.h"
#include "flashdllm/tokenizer.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/spm_tokenizer.h"

namespace fdl {

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& f) {
  std::string model;
  try {
    model = f.get_string("tokenizer.ggml.model");
  } catch (const GgufError& e) {
    throw TokenizerError(e.what());
  }
  if (model == "llama") {
    tok::VocabDefaults d;
    d.bos = 1;
    d.eos = 2;
    d.unk = 0;
    d.add_bos = true;
    d.add_space_prefix = true;
    return std::make_unique<tok::SpmTokenizer>(tok::load_vocab(f, tok::VocabModel::Spm, d));
  }
  if (model == "gpt2") {
    std::string pre_name;
    std::vector<std::string_view> merges;
    try {
      pre_name = f.get_string_or("tokenizer.ggml.pre", "");
      if (!f.find("tokenizer.ggml.merges"))
        throw TokenizerError(f.path() + ": metadata key 'tokenizer.ggml.merges' is required for "
                             "tokenizer model 'gpt2' but missing");
      merges = f.array_strings("tokenizer.ggml.merges");
    } catch (const GgufError& e) {
      throw TokenizerError(e.what());
    }
    tok::PreTokenizerConfig pre;
    try {
      pre = tok::resolve_pre_tokenizer(pre_name);
    } catch (const TokenizerError& e) {
      throw TokenizerError(f.path() + ": " + e.what());
    }
    tok::VocabDefaults d;
    d.bos = 11;  // llama.cpp's historical BPE defaults
    d.eos = 11;
    d.add_bos = pre.add_bos;
    return std::make_unique<tok::BpeTokenizer>(tok::load_vocab(f, tok::VocabModel::Bpe, d), merges, pre);
  }
  throw TokenizerError(f.path() + ": unsupported tokenizer model 'tokenizer.ggml.model' = '" +
                       model + "'; supported: llama, gpt2");
}

}  // namespace fdl
