// disk_store.h — tier 2: KV block slots in files on a local disk, asynchronous I/O through
// io_uring (liburing), files opened O_DIRECT so transfers hit the device, not the page cache.
//
// Layout: `n_files` files in `dir`, each a whole number of slots; slot i lives in file
// i % n_files at offset (i / n_files) * slot_bytes (striped, so sequential slots spread over
// files). slot_bytes = block_bytes rounded up to 4 KiB, so offsets and lengths are aligned.
// Files are created, space-reserved (fallocate, so a full disk fails at start, not mid-run)
// and unlinked right after opening: they vanish with the process, even after a crash.
//
// O_DIRECT fallback: where the filesystem refuses O_DIRECT (EINVAL at open or on the first
// aligned probe I/O, e.g. tmpfs on older kernels) the files are reopened buffered,
// direct_io() is false, direct_io_note() says why, and a spdlog warning is logged.
//
// I/O contract: submit_read/submit_write queue one whole-slot transfer and return at once;
// the buffer must be kIoAlign-aligned, slot_bytes() long, and must stay alive and untouched
// until that transfer's completion is returned by poll()/wait(). Completions come back in
// any order, each with the caller's tag. A failed or short transfer is reported in its
// completion (error = errno, or short_io), never thrown. When the ring is full, submit
// blocks until one transfer completes (its completion is kept for the next poll()).
//
// Errors: construction failures (bad options, cannot create/open/reserve, io_uring
// unavailable) throw DiskStoreError. Thread-safety: none; one thread (the engine thread)
// owns the store and polls its completions.
#pragma once

#include <liburing.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kv/aligned_buffer.h"
#include "kv/slot_allocator.h"

namespace fdl::kv {

class DiskStoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class DiskOp : uint8_t { Read, Write };
/// Test hook: what the next matching transfer reports instead of its real result.
enum class DiskFault : uint8_t { None, Eio, NoSpace, Short };

struct DiskCompletion {
  uint64_t tag = 0;
  DiskOp op = DiskOp::Read;
  uint32_t slot = 0;
  int error = 0;          ///< errno of a failed transfer, 0 on success
  bool short_io = false;  ///< fewer bytes than slot_bytes were transferred
  bool ok() const { return error == 0 && !short_io; }
};

struct DiskStoreOptions {
  std::filesystem::path dir;      ///< must exist and be writable
  size_t block_bytes = 0;         ///< > 0
  size_t capacity_blocks = 0;     ///< > 0
  unsigned n_files = 1;           ///< 1..64
  unsigned queue_depth = 32;      ///< io_uring entries, 1..4096
  /// Test hook: behave as if the filesystem refused O_DIRECT (exercises the fallback).
  bool refuse_direct_for_test = false;
};

class DiskStore {
 public:
  explicit DiskStore(const DiskStoreOptions& opt);
  /// Waits for in-flight transfers (their buffers belong to the caller), then closes.
  ~DiskStore();
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  bool direct_io() const { return direct_; }
  /// Empty when O_DIRECT is in use; else why buffered I/O was used.
  const std::string& direct_io_note() const { return direct_note_; }
  size_t block_bytes() const { return block_bytes_; }
  size_t slot_bytes() const { return slot_bytes_; }
  size_t capacity() const { return slots_.capacity(); }
  size_t n_free() const { return slots_.n_free(); }
  size_t n_used() const { return slots_.n_used(); }
  size_t in_flight() const { return in_flight_; }

  std::optional<uint32_t> allocate() { return slots_.allocate(); }
  void release(uint32_t slot) { slots_.release(slot); }

  /// Queue a whole-slot transfer (see the I/O contract above). Throws std::invalid_argument
  /// for an unallocated slot or a misaligned buffer, DiskStoreError if the kernel rejects
  /// the submission itself.
  void submit_write(uint32_t slot, const uint8_t* buf, uint64_t tag);
  void submit_read(uint32_t slot, uint8_t* buf, uint64_t tag);
  /// Append finished transfers to `out` without blocking; returns how many were appended.
  size_t poll(std::vector<DiskCompletion>& out);
  /// Block until at least min(min_n, in-flight + ready) completions are appended.
  size_t wait(std::vector<DiskCompletion>& out, size_t min_n);

  /// Test hook: the next `count` transfers of kind `op` report `fault` (the I/O itself runs).
  void inject_fault(DiskOp op, DiskFault fault, int count = 1);
  /// Test hook: flip one bit of a stored slot synchronously (no transfer may be in flight
  /// on that slot).
  void flip_bit_for_test(uint32_t slot, size_t byte_offset, int bit);

 private:
  struct Pending {
    bool busy = false;
    uint64_t tag = 0;
    DiskOp op = DiskOp::Read;
    uint32_t slot = 0;
    DiskFault fault = DiskFault::None;
  };
  void open_files(bool direct);
  void close_files();
  bool probe_direct();
  void submit(DiskOp op, uint32_t slot, uint8_t* buf, uint64_t tag);
  DiskCompletion finish(const io_uring_cqe& cqe);
  void reap_one_blocking();
  int fd_of(uint32_t slot) const { return fds_[slot % fds_.size()]; }
  off_t offset_of(uint32_t slot) const { return off_t(slot / fds_.size()) * off_t(slot_bytes_); }

  std::filesystem::path dir_;
  size_t block_bytes_;
  size_t slot_bytes_;
  unsigned n_files_;
  SlotAllocator slots_;
  std::vector<int> fds_;
  bool direct_ = true;
  std::string direct_note_;
  bool ring_ok_ = false;
  io_uring ring_{};
  std::vector<Pending> pending_;    // indexed by sqe user_data
  std::vector<uint32_t> free_pending_;
  size_t in_flight_ = 0;
  std::deque<DiskCompletion> ready_;  // reaped while submitting into a full ring
  DiskFault fault_[2] = {DiskFault::None, DiskFault::None};
  int fault_count_[2] = {0, 0};
};

const char* to_string(DiskFault f);

}  // namespace fdl::kv
