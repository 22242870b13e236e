// aligned_buffer.h — a heap buffer aligned for O_DIRECT I/O.
//
// O_DIRECT needs the user buffer, the file offset and the length aligned to the device's
// logical block size (512 B or 4 KiB); 4 KiB satisfies every device we target, and it is also
// the page size, so a later CUDA build can page-lock (cudaHostRegister) these buffers whole.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <span>
#include <utility>

namespace fdl::kv {

inline constexpr size_t kIoAlign = 4096;  ///< bytes; alignment of buffers, offsets, lengths

inline constexpr size_t round_up_io(size_t n) { return (n + kIoAlign - 1) / kIoAlign * kIoAlign; }

/// Owning kIoAlign-aligned byte buffer. Size is rounded up to kIoAlign. Zero-filled unless
/// `zero` is false: a large tier-1 arena is left untouched so the OS commits its pages only
/// as slots are first written (every slot is written before it is read).
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes, bool zero = true) : size_(round_up_io(bytes)) {
    if (size_ == 0) return;
    data_ = static_cast<uint8_t*>(std::aligned_alloc(kIoAlign, size_));
    if (data_ == nullptr) throw std::bad_alloc();
    if (zero) std::memset(data_, 0, size_);
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      std::free(data_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<uint8_t> span() { return {data_, size_}; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace fdl::kv
