// Byte-level BPE merging (GPT-2 style) as llama.cpp runs it for `tokenizer.ggml.model =
// gpt2` (llm_tokenizer_bpe_session), working on raw bytes instead of their mapped spelling.
//
// A pre-tokenized chunk starts as one symbol per byte. Repeatedly the adjacent pair with the
// lowest rank in `tokenizer.ggml.merges` ("left right", in mapped spelling; the first
// occurrence of a duplicate counts) is merged, leftmost on ties. Each final symbol becomes
// its vocab id; one that is not in the vocab falls back to the single-character entries of
// its mapped spelling (dropping bytes without one), as llama.cpp does. With
// `ignore_merges` (Llama 3), a chunk that is itself a vocab entry is emitted directly.
// Cost: O(n log n) in the chunk length; no string hashing per merge in the usual case.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/merge_table.h"
#include "tokenizer/string_map.h"
#include "tokenizer/string_table.h"
#include "tokenizer/vocab.h"

namespace fdl::tok {

class BpeModel {
 public:
  /// `vocab` must outlive the model. `merges` are the `tokenizer.ggml.merges` entries.
  BpeModel(const Vocab& vocab, const std::vector<std::string_view>& merges, bool ignore_merges);

  /// Append the ids of one pre-tokenized chunk (raw bytes) to `out`.
  void encode_chunk(std::string_view chunk, std::vector<int32_t>& out) const;

  /// Whether entry `id` is spelled in byte-map characters, and the raw bytes it stands for
  /// (empty when it is not).
  bool has_raw_bytes(int32_t id) const { return has_raw_[static_cast<size_t>(id)] != 0; }
  std::string_view raw_bytes(int32_t id) const { return bytes_.text(id); }

  /// Number of usable merge rules loaded.
  size_t n_merges() const { return id_rules_.size() + text_rules_.size(); }

 private:
  /// Rule for two adjacent symbols (given by bytes and, when they are entries, ids).
  MergeTable::Rule rule(std::string_view left, int32_t left_id, std::string_view right,
                        int32_t right_id) const;

  const Vocab& vocab_;
  bool ignore_merges_;
  std::vector<uint8_t> has_raw_;        ///< per id: its text is a byte-map spelling
  StringTable bytes_;                   ///< raw bytes of every such entry -> id
  std::array<int32_t, 256> byte_id_{};  ///< single-byte entries (-1: none)
  MergeTable id_rules_;                 ///< rules whose sides are both entries (the usual case)
  StringMap<int32_t> text_rules_;       ///< any other rule, by text_pair_key -> rank
};

}  // namespace fdl::tok
