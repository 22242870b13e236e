// Tokenizer::decode: llama.cpp's llama_detokenize (remove_special = false), without its
// optional clean_spaces pass (see the header).
#include "flashdllm/tokenizer.h"

namespace fdl {

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool render_special) const {
  std::string out;
  bool strip_space = add_space_prefix();
  for (int32_t id : ids) {
    const std::string piece = token_to_piece(id, render_special);
    const size_t skip = (strip_space && !piece.empty() && piece[0] == ' ') ? 1 : 0;
    out.append(piece, skip);
    strip_space = false;
  }
  return out;
}

}  // namespace fdl
