// `tokenizer.ggml.model = llama`: SentencePiece-style vocab (llama.cpp LLAMA_VOCAB_TYPE_SPM).
#pragma once

#include "tokenizer/spm_model.h"
#include "tokenizer/vocab_tokenizer.h"

namespace fdl::tok {

class SpmTokenizer final : public VocabTokenizer {
 public:
  explicit SpmTokenizer(Vocab vocab);

  /// Special text is split out first (special_split.h). Each remaining text fragment gets a
  /// leading space when add_space_prefix is set and it is the first fragment or follows a
  /// special token; spaces become U+2581; then SpmModel. BOS/EOS per add_bos/add_eos when
  /// `add_special`.
  std::vector<int32_t> encode(std::string_view text, bool add_special,
                              bool parse_special) const override;

 private:
  SpmModel model_;
};

}  // namespace fdl::tok
