#include "flashdllm/tokenizer.h"
#include "tokenizer/utf8.h"

namespace fdl {

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tok, bool render_special,
                                           bool continues_text)
    : tok_(tok), render_special_(render_special), first_(!continues_text) {}

std::string StreamingDetokenizer::push(int32_t id) {
  std::string piece = tok_.token_to_piece(id, render_special_);
  if (first_) {
    // Same rule as Tokenizer::decode: the first piece loses one leading space.
    if (tok_.add_space_prefix() && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    first_ = false;
  }
  pending_ += piece;

  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const tok::Utf8Step s = tok::utf8_step(pending_, i);
    if (s.truncated) break;  // may still complete with the next piece
    if (s.well_formed) out.append(pending_, i, s.length);
    else tok::append_utf8(out, tok::kReplacementChar);
    i += s.length;
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamingDetokenizer::flush() {
  std::string out = tok::to_well_formed_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace fdl
