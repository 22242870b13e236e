// host_store.h — tier 1: a fixed number of KV block slots in host DRAM.
//
// One arena allocated at construction (never resized). Each slot is round_up_io(block_bytes)
// long and 4 KiB aligned, so a slot can be the source/destination of an O_DIRECT transfer to
// tier 2 without a bounce buffer.
//
// Page-locking hook: on a CUDA build tier 1 must be pinned memory so that H2D/D2H copies run
// at PCIe speed and asynchronously. The constructor calls `PinHooks::pin(ptr, bytes)` once on
// the whole arena and the destructor calls `unpin`; the CPU build passes no hooks. A pin
// failure throws (std::runtime_error) from the constructor rather than running unpinned.
//
// Thread-safety: none; owned by the TierManager (engine thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>

#include "kv/aligned_buffer.h"
#include "kv/slot_allocator.h"

namespace fdl::kv {

struct PinHooks {
  std::function<void(void* ptr, size_t bytes)> pin;    ///< e.g. cudaHostRegister; may throw
  std::function<void(void* ptr, size_t bytes)> unpin;  ///< e.g. cudaHostUnregister; noexcept
};

class HostStore {
 public:
  /// `block_bytes` > 0; `capacity_blocks` may be 0 (tier disabled). Throws
  /// std::invalid_argument / std::bad_alloc.
  HostStore(size_t block_bytes, size_t capacity_blocks, PinHooks hooks = {});
  ~HostStore();
  HostStore(const HostStore&) = delete;
  HostStore& operator=(const HostStore&) = delete;

  size_t block_bytes() const { return block_bytes_; }
  size_t slot_bytes() const { return slot_bytes_; }
  size_t capacity() const { return slots_.capacity(); }
  size_t n_free() const { return slots_.n_free(); }
  size_t n_used() const { return slots_.n_used(); }

  std::optional<uint32_t> allocate() { return slots_.allocate(); }
  void release(uint32_t slot) { slots_.release(slot); }
  /// The block bytes of an allocated slot (block_bytes long). Throws std::invalid_argument
  /// for a slot that is not allocated.
  std::span<uint8_t> bytes(uint32_t slot);
  /// The whole aligned slot (slot_bytes long), for direct I/O.
  uint8_t* slot_ptr(uint32_t slot);
  /// The whole arena (capacity() slots): scratch for a link measurement before first use.
  uint8_t* arena_ptr() { return arena_.data(); }
  size_t arena_bytes() const { return arena_.size(); }

 private:
  size_t block_bytes_;
  size_t slot_bytes_;
  SlotAllocator slots_;
  AlignedBuffer arena_;
  PinHooks hooks_;
};

}  // namespace fdl::kv
