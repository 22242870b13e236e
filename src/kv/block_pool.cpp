// BlockPool: one arena of fixed-size KV blocks, a LIFO free list and per-block metadata.
//
// The arena is sized once in the constructor and never resized, so pointers returned by
// k_ptr/v_ptr stay valid for the pool's lifetime (the forward pass and the tier manager rely
// on that: appending a token never moves existing KV data).
#include "flashdllm/kv_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <string>

#include "kv/kv_uid.h"

namespace fdl {
namespace {

void check_shape(const KvShape& s) {
  if (s.dtype != KvDtype::F32 && s.dtype != KvDtype::F16 && s.dtype != KvDtype::BF16)
    throw std::invalid_argument("BlockPool: unknown KV dtype " + std::to_string(int(s.dtype)));
  if (s.n_layer <= 0 || s.n_kv_head <= 0 || s.head_dim <= 0 || s.block_size <= 0)
    throw std::invalid_argument("BlockPool: KvShape needs positive n_layer, n_kv_head, head_dim "
                                "and block_size (got " + std::to_string(s.n_layer) + ", " +
                                std::to_string(s.n_kv_head) + ", " + std::to_string(s.head_dim) +
                                ", " + std::to_string(s.block_size) + ")");
}

size_t checked_arena_bytes(const KvShape& s, size_t n_blocks) {
  const size_t per_block = s.block_bytes();
  if (n_blocks > std::numeric_limits<size_t>::max() / per_block)
    throw std::invalid_argument("BlockPool: " + std::to_string(n_blocks) + " blocks of " +
                                std::to_string(s.block_bytes()) + " bytes overflow size_t");
  if (n_blocks > size_t(std::numeric_limits<BlockId>::max()))
    throw std::invalid_argument("BlockPool: too many blocks for a 32-bit BlockId: " +
                                std::to_string(n_blocks));
  return per_block * n_blocks;
}

}  // namespace

void detail::ArenaUnmap::operator()(uint8_t* p) const noexcept {
  if (p != nullptr) ::munmap(p, bytes);
}

uint64_t next_kv_uid() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

BlockPool::BlockPool(const KvShape& shape, size_t n_blocks) : shape_(shape), uid_(next_kv_uid()) {
  check_shape(shape_);
  // At least one page, so an empty pool still has a valid (never read) address.
  const size_t bytes = std::max<size_t>(checked_arena_bytes(shape_, n_blocks), 1);
  // Without MAP_NORESERVE: the kernel's overcommit check still refuses an arena larger than
  // the machine can back (std::bad_alloc, as the vector this replaces threw), while a
  // fitting one costs its pages only once they are written.
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  arena_ = std::unique_ptr<uint8_t, detail::ArenaUnmap>(static_cast<uint8_t*>(p), detail::ArenaUnmap{bytes});
  meta_.resize(n_blocks);
  free_.reserve(n_blocks);
  // Pushed in reverse so that a fresh pool hands out blocks 0, 1, 2, ... (deterministic,
  // and keeps early blocks at the front of the arena).
  for (size_t i = n_blocks; i-- > 0;) free_.push_back(static_cast<BlockId>(i));
}

BlockId BlockPool::allocate() {
  if (free_.empty())
    throw KvCacheFull("KV cache full: all " + std::to_string(capacity()) + " blocks of " +
                      std::to_string(shape_.block_size) + " tokens are in use");
  const BlockId id = free_.back();
  free_.pop_back();
  BlockMeta& m = meta_[size_t(id)];
  m = BlockMeta{};
  m.state = BlockState::Active;
  m.ref_count = 1;
  return id;
}

void BlockPool::retain(BlockId id) {
  BlockMeta& m = meta(id);
  if (m.ref_count <= 0)
    throw std::invalid_argument("BlockPool::retain: block " + std::to_string(id) + " is free");
  ++m.ref_count;
}

void BlockPool::release(BlockId id) {
  BlockMeta& m = meta(id);
  if (m.ref_count <= 0)
    throw std::invalid_argument("BlockPool::release: block " + std::to_string(id) +
                                " is already free");
  if (--m.ref_count == 0) {
    m = BlockMeta{};  // state Free, counters cleared
    free_.push_back(id);
  }
}

BlockMeta& BlockPool::meta(BlockId id) {
  if (id < 0 || size_t(id) >= meta_.size())
    throw std::out_of_range("BlockPool: block id " + std::to_string(id) + " out of range [0, " +
                            std::to_string(meta_.size()) + ")");
  return meta_[size_t(id)];
}

const BlockMeta& BlockPool::meta(BlockId id) const {
  return const_cast<BlockPool*>(this)->meta(id);
}

size_t BlockPool::layer_stride() const {
  return 2 * size_t(shape_.block_size) * shape_.elems_per_token_per_layer() * kv_dtype_bytes(shape_.dtype);
}

std::span<uint8_t> BlockPool::slot_bytes(BlockId id, int layer, int slot, bool v) {
  meta(id);  // range check of the id
  if (layer < 0 || layer >= shape_.n_layer || slot < 0 || slot >= shape_.block_size)
    throw std::out_of_range("BlockPool: layer " + std::to_string(layer) + " / slot " +
                            std::to_string(slot) + " out of range");
  const size_t row = shape_.elems_per_token_per_layer() * kv_dtype_bytes(shape_.dtype);
  // V follows the block_size K vectors of the same layer.
  uint8_t* p = arena_.get() + size_t(id) * shape_.block_bytes() +
               size_t(layer) * layer_stride() + (size_t(slot) + (v ? size_t(shape_.block_size) : 0)) * row;
  return {p, row};
}

float* BlockPool::f32_slot(BlockId id, int layer, int slot, bool v) {
  if (shape_.dtype != KvDtype::F32)
    throw std::logic_error(std::string("BlockPool: fp32 access to a pool of ") + kv_dtype_name(shape_.dtype) +
                           " K/V (the CPU model needs --kv-cache-dtype f32)");
  return reinterpret_cast<float*>(slot_bytes(id, layer, slot, v).data());
}

float* BlockPool::k_ptr(BlockId id, int layer, int slot) { return f32_slot(id, layer, slot, false); }

float* BlockPool::v_ptr(BlockId id, int layer, int slot) { return f32_slot(id, layer, slot, true); }

const float* BlockPool::k_ptr(BlockId id, int layer, int slot) const {
  return const_cast<BlockPool*>(this)->k_ptr(id, layer, slot);
}

const float* BlockPool::v_ptr(BlockId id, int layer, int slot) const {
  return const_cast<BlockPool*>(this)->v_ptr(id, layer, slot);
}

std::span<uint8_t> BlockPool::block_bytes(BlockId id) {
  return {slot_bytes(id, 0, 0, false).data(), shape_.block_bytes()};
}

std::span<uint8_t> BlockPool::block_bytes_for_write(BlockId id) {
  if (const auto m = mirror_.lock()) m->host_write_fence(id);
  return block_bytes(id);
}

void BlockPool::set_mirror(std::weak_ptr<BlockMirror> mirror) {
  const auto old = mirror_.lock();
  if (old && old != mirror.lock()) old->pool_closing();
  mirror_ = std::move(mirror);
}

BlockPool::~BlockPool() {
  if (const auto m = mirror_.lock()) m->pool_closing();
}

void BlockPool::pull_from_mirror(BlockId id) {
  if (const auto m = mirror_.lock()) m->pull(id, block_bytes(id));
}

void BlockPool::push_to_mirror(BlockId id) {
  if (const auto m = mirror_.lock()) m->push(id, block_bytes(id));
}

}  // namespace fdl
