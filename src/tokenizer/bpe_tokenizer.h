// `tokenizer.ggml.model = gpt2`: byte-level BPE vocab (llama.cpp LLAMA_VOCAB_TYPE_BPE).
#pragma once

#include <vector>

#include "tokenizer/bpe_model.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/vocab_tokenizer.h"

namespace fdl::tok {

class BpeTokenizer final : public VocabTokenizer {
 public:
  BpeTokenizer(Vocab vocab, const std::vector<std::string_view>& merges,
               const PreTokenizerConfig& pre);

  /// Special text is split out first (special_split.h); each text fragment is cut by the
  /// pre-tokenizer and every chunk merged by BpeModel. BOS/EOS per add_bos/add_eos when
  /// `add_special`.
  std::vector<int32_t> encode(std::string_view text, bool add_special,
                              bool parse_special) const override;

 private:
  PreTokenizer pre_;
  BpeModel model_;
};

}  // namespace fdl::tok
