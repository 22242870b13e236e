// KvCache: per-sequence block tables over a BlockPool, with fork by refcount and
// copy-on-write of a shared tail block.
#include "flashdllm/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "kv/kv_uid.h"

namespace fdl {
namespace {

size_t blocks_for(size_t n_tokens, size_t block_size) {
  return (n_tokens + block_size - 1) / block_size;
}

}  // namespace

KvCache::KvCache(BlockPool& pool) : pool_(pool), uid_(next_kv_uid()) {}

KvCache::~KvCache() {
  for (Seq& s : seqs_)
    if (s.live)
      for (BlockId b : s.blocks) pool_.release(b);
}

KvCache::Seq& KvCache::seq_ref(SeqId s) {
  if (s < 0 || size_t(s) >= seqs_.size() || !seqs_[size_t(s)].live)
    throw std::out_of_range("KvCache: no live sequence with id " + std::to_string(s));
  return seqs_[size_t(s)];
}

const KvCache::Seq& KvCache::seq_ref(SeqId s) const {
  return const_cast<KvCache*>(this)->seq_ref(s);
}

SeqId KvCache::create_sequence() {
  SeqId id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = static_cast<SeqId>(seqs_.size());
    seqs_.emplace_back();
  }
  Seq& s = seqs_[size_t(id)];
  s.live = true;
  s.length = 0;
  s.blocks.clear();
  return id;
}

void KvCache::free_sequence(SeqId seq) {
  Seq& s = seq_ref(seq);
  for (BlockId b : s.blocks) pool_.release(b);
  s.blocks.clear();
  s.length = 0;
  s.live = false;
  free_ids_.push_back(seq);
}

SeqId KvCache::fork_sequence(SeqId parent) {
  seq_ref(parent);  // validate before creating anything
  const SeqId child = create_sequence();
  // seqs_ may have grown: take references only after create_sequence.
  Seq& p = seqs_[size_t(parent)];
  Seq& c = seqs_[size_t(child)];
  c.length = p.length;
  c.blocks = p.blocks;
  for (BlockId b : c.blocks) pool_.retain(b);
  return child;
}

SeqId KvCache::create_sequence_from(std::span<const BlockId> prefix) {
  for (BlockId b : prefix)
    if (b < 0 || size_t(b) >= pool_.capacity() || pool_.meta(b).ref_count == 0)
      throw std::out_of_range("KvCache::create_sequence_from: block " + std::to_string(b) +
                              " is not an allocated block of the pool");
  const SeqId id = create_sequence();
  Seq& s = seqs_[size_t(id)];
  s.blocks.assign(prefix.begin(), prefix.end());
  for (BlockId b : s.blocks) pool_.retain(b);
  s.length = prefix.size() * size_t(pool_.shape().block_size);
  return id;
}

size_t KvCache::blocks_needed(SeqId seq, size_t n) const {
  const Seq& s = seq_ref(seq);
  const size_t bs = size_t(pool_.shape().block_size);
  if (n == 0) return 0;
  const size_t new_blocks = blocks_for(s.length + n, bs) - s.blocks.size();
  const bool cow = s.length % bs != 0 && pool_.meta(s.blocks.back()).ref_count > 1;
  return new_blocks + (cow ? 1 : 0);
}

size_t KvCache::length(SeqId seq) const { return seq_ref(seq).length; }

size_t KvCache::append_slots(SeqId seq, size_t n) {
  Seq& s = seq_ref(seq);
  const size_t bs = size_t(pool_.shape().block_size);
  const size_t old_len = s.length;
  if (n > pool_.capacity() * bs)  // can never fit; also keeps old_len + n from overflowing
    throw KvCacheFull("KV cache full: " + std::to_string(n) + " tokens exceed the pool's " +
                      std::to_string(pool_.capacity() * bs) + "-token capacity");
  const size_t tail_fill = old_len % bs;  // slots used in a partially filled tail block
  const size_t new_blocks = blocks_for(old_len + n, bs) - s.blocks.size();
  // A partial tail block shared with another sequence must be copied before we write into it.
  const bool cow = n > 0 && tail_fill != 0 && pool_.meta(s.blocks.back()).ref_count > 1;
  const size_t needed = new_blocks + (cow ? 1 : 0);
  if (needed > pool_.n_free())
    throw KvCacheFull("KV cache full: sequence " + std::to_string(seq) + " needs " +
                      std::to_string(needed) + " more blocks for " + std::to_string(n) +
                      " tokens, " + std::to_string(pool_.n_free()) + " free of " +
                      std::to_string(pool_.capacity()));
  s.blocks.reserve(s.blocks.size() + new_blocks);  // the only step that may throw bad_alloc

  if (cow) {
    const BlockId shared = s.blocks.back();
    const BlockId copy = pool_.allocate();
    std::span<uint8_t> dst = pool_.block_bytes_for_write(copy);
    std::span<const uint8_t> src = pool_.block_bytes(shared);
    std::memcpy(dst.data(), src.data(), dst.size());
    pool_.meta(copy).n_filled = uint32_t(tail_fill);
    pool_.release(shared);
    s.blocks.back() = copy;
    ++blocks_copied_;
    if (copy_observer_) copy_observer_(shared, copy);
  }
  for (size_t i = 0; i < new_blocks; ++i) s.blocks.push_back(pool_.allocate());

  s.length = old_len + n;
  // Record how many slots of each touched block are now in use.
  for (size_t b = old_len / bs; b < s.blocks.size(); ++b) {
    const size_t used = std::min(bs, s.length - b * bs);
    BlockMeta& m = pool_.meta(s.blocks[b]);
    if (m.n_filled < used) m.n_filled = uint32_t(used);
  }
  return old_len;
}

void KvCache::truncate(SeqId seq, size_t new_length) {
  Seq& s = seq_ref(seq);
  if (new_length > s.length)
    throw std::invalid_argument("KvCache::truncate: new length " + std::to_string(new_length) +
                                " exceeds sequence " + std::to_string(seq) + " length " +
                                std::to_string(s.length));
  const size_t bs = size_t(pool_.shape().block_size);
  const size_t keep = blocks_for(new_length, bs);
  for (size_t b = keep; b < s.blocks.size(); ++b) pool_.release(s.blocks[b]);
  s.blocks.resize(keep);
  s.length = new_length;
  // A block only this sequence uses now holds exactly the kept slots.
  if (keep > 0) {
    BlockMeta& m = pool_.meta(s.blocks.back());
    if (m.ref_count == 1) m.n_filled = uint32_t(new_length - (keep - 1) * bs);
  }
}

std::span<const BlockId> KvCache::block_table(SeqId seq) const { return seq_ref(seq).blocks; }

size_t KvCache::n_sequences() const { return seqs_.size() - free_ids_.size(); }

float* KvCache::k_slot(SeqId seq, int layer, size_t pos) {
  Seq& s = seq_ref(seq);
  if (pos >= s.length)
    throw std::out_of_range("KvCache: position " + std::to_string(pos) + " not reserved in sequence " +
                            std::to_string(seq) + " (length " + std::to_string(s.length) + ")");
  const size_t bs = size_t(pool_.shape().block_size);
  return pool_.k_ptr(s.blocks[pos / bs], layer, int(pos % bs));
}

float* KvCache::v_slot(SeqId seq, int layer, size_t pos) {
  Seq& s = seq_ref(seq);
  if (pos >= s.length)
    throw std::out_of_range("KvCache: position " + std::to_string(pos) + " not reserved in sequence " +
                            std::to_string(seq) + " (length " + std::to_string(s.length) + ")");
  const size_t bs = size_t(pool_.shape().block_size);
  return pool_.v_ptr(s.blocks[pos / bs], layer, int(pos % bs));
}

void KvCache::move_slot(SeqId seq, size_t from, size_t to) {
  const Seq& s = seq_ref(seq);
  const size_t bs = size_t(pool_.shape().block_size);
  if (from >= s.length || to >= s.length)
    throw std::out_of_range("KvCache: move_slot " + std::to_string(from) + " -> " + std::to_string(to) +
                            " outside sequence " + std::to_string(seq) + " (length " + std::to_string(s.length) + ")");
  if (from == to) return;  // changes nothing, also in a shared block
  if (pool_.meta(s.blocks[to / bs]).ref_count != 1)
    throw std::invalid_argument("KvCache: move_slot target " + std::to_string(to) + " of sequence " +
                                std::to_string(seq) + " lies in a shared block");
  const BlockId fb = s.blocks[from / bs], tb = s.blocks[to / bs];
  for (int layer = 0; layer < pool_.shape().n_layer; ++layer)
    for (const bool v : {false, true}) {
      const std::span<uint8_t> src = pool_.slot_bytes(fb, layer, int(from % bs), v);
      std::copy(src.begin(), src.end(), pool_.slot_bytes(tb, layer, int(to % bs), v).begin());
    }
  ++slots_moved_;
  if (move_observer_)
    move_observer_(s.blocks[from / bs], int(from % bs), s.blocks[to / bs], int(to % bs));
}

}  // namespace fdl
