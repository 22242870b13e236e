// HostStore: tier-1 slot arena in host DRAM (see host_store.h).
#include "kv/host_store.h"

#include <sys/mman.h>

#include <limits>
#include <stdexcept>
#include <string>

namespace fdl::kv {
namespace {

size_t checked_arena_bytes(size_t slot_bytes, size_t n) {
  if (n != 0 && slot_bytes > std::numeric_limits<size_t>::max() / n)
    throw std::invalid_argument("HostStore: " + std::to_string(n) + " slots of " +
                                std::to_string(slot_bytes) + " bytes overflow size_t");
  if (n > std::numeric_limits<uint32_t>::max())
    throw std::invalid_argument("HostStore: too many slots: " + std::to_string(n));
  return slot_bytes * n;
}

}  // namespace

HostStore::HostStore(size_t block_bytes, size_t capacity_blocks, PinHooks hooks)
    : block_bytes_(block_bytes),
      slot_bytes_(round_up_io(block_bytes)),
      slots_(capacity_blocks),
      hooks_(std::move(hooks)) {
  if (block_bytes == 0) throw std::invalid_argument("HostStore: block_bytes must be > 0");
  arena_ = AlignedBuffer(checked_arena_bytes(slot_bytes_, capacity_blocks), /*zero=*/false);
  if (hooks_.pin && arena_.size() > 0) {
    // Page-locking faults in and pins every page: with transparent huge pages that is 512x
    // fewer pages (a hint; ignored where THP is off).
    (void)::madvise(arena_.data(), arena_.size(), MADV_HUGEPAGE);
    hooks_.pin(arena_.data(), arena_.size());
  }
}

HostStore::~HostStore() {
  if (hooks_.pin && hooks_.unpin && arena_.size() > 0) hooks_.unpin(arena_.data(), arena_.size());
}

uint8_t* HostStore::slot_ptr(uint32_t slot) {
  if (!slots_.is_used(slot))
    throw std::invalid_argument("HostStore: slot " + std::to_string(slot) + " is not allocated");
  return arena_.data() + size_t(slot) * slot_bytes_;
}

std::span<uint8_t> HostStore::bytes(uint32_t slot) { return {slot_ptr(slot), block_bytes_}; }

}  // namespace fdl::kv
