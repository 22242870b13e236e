// The shared StepBatch checks (see step_batch_check.h).
#include "model/step_batch_check.h"

#include <stdexcept>
#include <string>

namespace fdl {

void check_step_batch(const StepBatch& b, const KvCache& kv, const ModelConfig& c, KvDtype kv_dtype,
                      TokenTreeLayout& tree, const NegativeTokenCheck& negative_token) {
  const size_t n = b.tokens.size();
  if (b.positions.size() != n || b.seqs.size() != n || b.want_logits.size() != n)
    throw std::invalid_argument("forward: StepBatch vectors differ in length (tokens " + std::to_string(n) +
                                ", positions " + std::to_string(b.positions.size()) + ", seqs " +
                                std::to_string(b.seqs.size()) + ", want_logits " +
                                std::to_string(b.want_logits.size()) + ")");
  const KvShape& s = kv.pool().shape();
  if (s.n_layer != c.n_layer || s.n_kv_head != c.n_head_kv || s.head_dim != c.head_dim || s.dtype != kv_dtype)
    throw std::invalid_argument("forward: KV cache shape (layers " + std::to_string(s.n_layer) + ", kv heads " +
                                std::to_string(s.n_kv_head) + ", head dim " + std::to_string(s.head_dim) + ", " +
                                kv_dtype_name(s.dtype) + ") does not match the model (" + kv_dtype_name(kv_dtype) +
                                ")");
  tree.resolve(b);  // throws std::invalid_argument for a malformed tree
  for (size_t i = 0; i < n; ++i) {
    if (b.tokens[i] < 0 && negative_token)
      negative_token(i, b.tokens[i]);
    else if (b.tokens[i] < 0 || b.tokens[i] >= c.n_vocab)
      throw std::out_of_range("forward: token " + std::to_string(i) + " has id " + std::to_string(b.tokens[i]) +
                              " outside [0, " + std::to_string(c.n_vocab) + ")");
    const size_t len = kv.length(b.seqs[i]);  // throws std::out_of_range for a dead sequence
    const int32_t slot = tree.slot(i);         // the position, unless a tree token
    if (slot < 0 || size_t(slot) >= len)
      throw std::out_of_range("forward: token " + std::to_string(i) + " position " + std::to_string(b.positions[i]) +
                              (slot != b.positions[i] ? " (tree slot " + std::to_string(slot) + ")" : std::string()) +
                              " is not a reserved slot of sequence " + std::to_string(b.seqs[i]) + " (length " +
                              std::to_string(len) + "; call append_slots first)");
    // Writing K/V into a block another sequence shares would change that sequence too.
    const BlockId block = kv.block_table(b.seqs[i])[size_t(slot) / size_t(s.block_size)];
    if (kv.pool().meta(block).ref_count != 1)
      throw std::invalid_argument("forward: token " + std::to_string(i) + " slot " + std::to_string(slot) +
                                  " of sequence " + std::to_string(b.seqs[i]) + " lies in block " +
                                  std::to_string(block) +
                                  " shared with another sequence (forked); truncate and append_slots to get a "
                                  "private slot");
  }
}

}  // namespace fdl
