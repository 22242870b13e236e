// Common base of the concrete tokenizers: owns the Vocab, answers the vocabulary queries and
// serves token pieces from a table built once at load (like llama.cpp's piece cache).
#pragma once

#include <string>
#include <vector>

#include "flashdllm/tokenizer.h"
#include "tokenizer/vocab.h"

namespace fdl::tok {

class VocabTokenizer : public Tokenizer {
 public:
  explicit VocabTokenizer(Vocab vocab);
  VocabTokenizer(const VocabTokenizer&) = delete;
  VocabTokenizer& operator=(const VocabTokenizer&) = delete;

  std::string token_to_piece(int32_t id, bool render_special) const override;
  int32_t n_vocab() const override { return vocab_.size(); }
  std::string_view model_name() const override { return vocab_.model_name; }
  const std::string& token_text(int32_t id) const override;
  TokenType token_type(int32_t id) const override;
  int32_t token_id(std::string_view text) const override { return vocab_.find(text); }
  int32_t bos_id() const override { return vocab_.bos; }
  int32_t eos_id() const override { return vocab_.eos; }
  bool add_bos() const override { return vocab_.add_bos; }
  bool add_eos() const override { return vocab_.add_eos; }
  bool add_space_prefix() const override { return vocab_.add_space_prefix; }
  bool is_eog(int32_t id) const override { return vocab_.valid_id(id) && vocab_.eog[id] != 0; }

 protected:
  /// Pieces as rendered with render_special = true, one per token; called by subclasses'
  /// constructors.
  void set_pieces(StringArena pieces) { pieces_ = std::move(pieces); }
  /// Throws TokenizerError for an id outside [0, n_vocab).
  void check_id(int32_t id) const;

  const Vocab vocab_;

 private:
  StringArena pieces_;
};

}  // namespace fdl::tok
