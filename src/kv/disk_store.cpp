// DiskStore: tier-2 slots in O_DIRECT files with io_uring I/O (see disk_store.h).
#include "kv/disk_store.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

namespace fdl::kv {
namespace {

std::string errno_text(int e) {
  return std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")";
}

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kIoAlign == 0; }

void validate(const DiskStoreOptions& o) {
  if (o.block_bytes == 0) throw DiskStoreError("DiskStore: block_bytes must be > 0");
  if (o.capacity_blocks == 0) throw DiskStoreError("DiskStore: capacity_blocks must be > 0");
  if (o.capacity_blocks > std::numeric_limits<uint32_t>::max())
    throw DiskStoreError("DiskStore: too many slots: " + std::to_string(o.capacity_blocks));
  if (o.n_files == 0 || o.n_files > 64)
    throw DiskStoreError("DiskStore: n_files must be in [1, 64], got " + std::to_string(o.n_files));
  if (o.queue_depth == 0 || o.queue_depth > 4096)
    throw DiskStoreError("DiskStore: queue_depth must be in [1, 4096], got " +
                         std::to_string(o.queue_depth));
  std::error_code ec;
  if (!std::filesystem::is_directory(o.dir, ec))
    throw DiskStoreError("DiskStore: --kv-disk-path '" + o.dir.string() + "' is not a directory");
}

}  // namespace

const char* to_string(DiskFault f) {
  switch (f) {
    case DiskFault::None: return "none";
    case DiskFault::Eio: return "EIO";
    case DiskFault::NoSpace: return "ENOSPC";
    case DiskFault::Short: return "short transfer";
  }
  return "?";
}

DiskStore::DiskStore(const DiskStoreOptions& opt)
    : dir_(opt.dir),
      block_bytes_(opt.block_bytes),
      slot_bytes_(round_up_io(opt.block_bytes)),
      n_files_(opt.n_files),
      slots_((validate(opt), opt.capacity_blocks)) {
  if (opt.n_files > opt.capacity_blocks) n_files_ = unsigned(opt.capacity_blocks);
  if (opt.refuse_direct_for_test) {
    direct_ = false;
    direct_note_ = "O_DIRECT refused (test hook): using buffered I/O";
    open_files(false);
  } else {
    try {
      open_files(true);
    } catch (const DiskStoreError&) {
      // open() itself refused O_DIRECT; any other failure repeats below and is thrown.
      direct_ = false;
    }
    if (direct_ && !probe_direct()) direct_ = false;
    if (!direct_) {
      close_files();
      if (direct_note_.empty())
        direct_note_ = "O_DIRECT refused by the filesystem of '" + dir_.string() +
                       "' (EINVAL): using buffered I/O";
      open_files(false);
    }
  }
  if (!direct_)
    spdlog::warn("kv tier 2: {}; measurements and transfers go through the page cache",
                 direct_note_);
  const int rc = io_uring_queue_init(opt.queue_depth, &ring_, 0);
  if (rc < 0) {
    close_files();
    throw DiskStoreError("DiskStore: io_uring unavailable: " + errno_text(-rc));
  }
  ring_ok_ = true;
  pending_.resize(opt.queue_depth);
  for (uint32_t i = opt.queue_depth; i-- > 0;) free_pending_.push_back(i);
}

DiskStore::~DiskStore() {
  if (ring_ok_) {
    // The caller's buffers must not be freed under a transfer: drain first.
    while (in_flight_ > 0) {
      try {
        reap_one_blocking();
      } catch (...) {
        break;  // the ring is broken; closing the fds below cancels what is left
      }
    }
    io_uring_queue_exit(&ring_);
  }
  close_files();
}

void DiskStore::open_files(bool direct) {
  const size_t per_file = (slots_.capacity() + n_files_ - 1) / n_files_;
  const off_t file_bytes = off_t(per_file * slot_bytes_);
  for (unsigned i = 0; i < n_files_; ++i) {
    const auto path = dir_ / ("flashdllm-kv-" + std::to_string(::getpid()) + "-" +
                              std::to_string(uintptr_t(this) & 0xffffff) + "-" +
                              std::to_string(i) + ".tier2");
    int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
    if (direct) flags |= O_DIRECT;
    const int fd = ::open(path.c_str(), flags, 0600);
    if (fd < 0) {
      const int e = errno;
      close_files();
      if (direct && e == EINVAL) throw DiskStoreError("O_DIRECT refused");
      throw DiskStoreError("DiskStore: cannot create '" + path.string() + "': " + errno_text(e));
    }
    ::unlink(path.c_str());  // anonymous from now on: nothing is left behind
    fds_.push_back(fd);
    int rc = ::posix_fallocate(fd, 0, file_bytes);
    if (rc == EOPNOTSUPP || rc == EINVAL) rc = ::ftruncate(fd, file_bytes) == 0 ? 0 : errno;
    if (rc != 0) {
      close_files();
      throw DiskStoreError("DiskStore: cannot reserve " + std::to_string(file_bytes) +
                           " bytes in '" + dir_.string() + "': " + errno_text(rc));
    }
  }
}

void DiskStore::close_files() {
  for (int fd : fds_) ::close(fd);
  fds_.clear();
}

// Some filesystems accept O_DIRECT at open and refuse the I/O; one aligned write+read tells.
bool DiskStore::probe_direct() {
  AlignedBuffer buf(kIoAlign);
  if (::pwrite(fds_[0], buf.data(), kIoAlign, 0) == ssize_t(kIoAlign) &&
      ::pread(fds_[0], buf.data(), kIoAlign, 0) == ssize_t(kIoAlign))
    return true;
  const int e = errno;
  if (e != EINVAL) throw DiskStoreError("DiskStore: probe I/O failed in '" + dir_.string() +
                                        "': " + errno_text(e));
  direct_note_ = "O_DIRECT I/O refused in '" + dir_.string() + "' (EINVAL): using buffered I/O";
  return false;
}

void DiskStore::submit_write(uint32_t slot, const uint8_t* buf, uint64_t tag) {
  submit(DiskOp::Write, slot, const_cast<uint8_t*>(buf), tag);
}

void DiskStore::submit_read(uint32_t slot, uint8_t* buf, uint64_t tag) {
  submit(DiskOp::Read, slot, buf, tag);
}

void DiskStore::submit(DiskOp op, uint32_t slot, uint8_t* buf, uint64_t tag) {
  if (!slots_.is_used(slot))
    throw std::invalid_argument("DiskStore: slot " + std::to_string(slot) + " is not allocated");
  if (buf == nullptr || !aligned(buf))
    throw std::invalid_argument("DiskStore: I/O buffer must be 4096-byte aligned");
  while (free_pending_.empty()) reap_one_blocking();
  const uint32_t idx = free_pending_.back();
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) throw DiskStoreError("DiskStore: io_uring submission queue full");
  free_pending_.pop_back();
  Pending& p = pending_[idx];
  p = Pending{true, tag, op, slot, DiskFault::None};
  const int k = int(op);
  if (fault_count_[k] > 0) {
    p.fault = fault_[k];
    if (--fault_count_[k] == 0) fault_[k] = DiskFault::None;
  }
  if (op == DiskOp::Write)
    io_uring_prep_write(sqe, fd_of(slot), buf, unsigned(slot_bytes_), uint64_t(offset_of(slot)));
  else
    io_uring_prep_read(sqe, fd_of(slot), buf, unsigned(slot_bytes_), uint64_t(offset_of(slot)));
  io_uring_sqe_set_data64(sqe, idx);
  const int rc = io_uring_submit(&ring_);
  if (rc < 0) {
    p.busy = false;
    free_pending_.push_back(idx);
    throw DiskStoreError("DiskStore: io_uring_submit failed: " + errno_text(-rc));
  }
  ++in_flight_;
}

DiskCompletion DiskStore::finish(const io_uring_cqe& cqe) {
  const auto idx = uint32_t(cqe.user_data);
  Pending& p = pending_.at(idx);
  DiskCompletion c{p.tag, p.op, p.slot, 0, false};
  int res = cqe.res;
  switch (p.fault) {  // test hook: override the real result
    case DiskFault::Eio: res = -EIO; break;
    case DiskFault::NoSpace: res = -ENOSPC; break;
    case DiskFault::Short: res = res > 0 ? res / 2 : 0; break;
    case DiskFault::None: break;
  }
  if (res < 0)
    c.error = -res;
  else if (size_t(res) != slot_bytes_)
    c.short_io = true;
  p.busy = false;
  free_pending_.push_back(idx);
  --in_flight_;
  return c;
}

void DiskStore::reap_one_blocking() {
  io_uring_cqe* cqe = nullptr;
  int rc;
  do rc = io_uring_wait_cqe(&ring_, &cqe);
  while (rc == -EINTR);
  if (rc < 0) throw DiskStoreError("DiskStore: io_uring_wait_cqe failed: " + errno_text(-rc));
  ready_.push_back(finish(*cqe));
  io_uring_cqe_seen(&ring_, cqe);
}

size_t DiskStore::poll(std::vector<DiskCompletion>& out) {
  size_t n = 0;
  for (; !ready_.empty(); ++n) {
    out.push_back(ready_.front());
    ready_.pop_front();
  }
  io_uring_cqe* cqe = nullptr;
  while (in_flight_ > 0 && io_uring_peek_cqe(&ring_, &cqe) == 0 && cqe != nullptr) {
    out.push_back(finish(*cqe));
    io_uring_cqe_seen(&ring_, cqe);
    ++n;
  }
  return n;
}

size_t DiskStore::wait(std::vector<DiskCompletion>& out, size_t min_n) {
  size_t n = poll(out);
  while (n < min_n && in_flight_ > 0) {
    reap_one_blocking();
    n += poll(out);
  }
  return n;
}

void DiskStore::inject_fault(DiskOp op, DiskFault fault, int count) {
  fault_[int(op)] = count > 0 ? fault : DiskFault::None;
  fault_count_[int(op)] = fault == DiskFault::None ? 0 : count;
}

void DiskStore::flip_bit_for_test(uint32_t slot, size_t byte_offset, int bit) {
  if (!slots_.is_used(slot) || byte_offset >= block_bytes_ || bit < 0 || bit > 7)
    throw std::invalid_argument("DiskStore::flip_bit_for_test: bad slot/offset/bit");
  AlignedBuffer buf(slot_bytes_);
  if (::pread(fd_of(slot), buf.data(), slot_bytes_, offset_of(slot)) != ssize_t(slot_bytes_))
    throw DiskStoreError("DiskStore::flip_bit_for_test: read failed: " + errno_text(errno));
  buf.data()[byte_offset] ^= uint8_t(1u << bit);
  if (::pwrite(fd_of(slot), buf.data(), slot_bytes_, offset_of(slot)) != ssize_t(slot_bytes_))
    throw DiskStoreError("DiskStore::flip_bit_for_test: write failed: " + errno_text(errno));
}

}  // namespace fdl::kv
