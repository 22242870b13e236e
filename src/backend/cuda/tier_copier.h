// tier_copier.h — asynchronous KV block copies between the CUDA model's device arena and
// page-locked host memory, for the KV tiers (the BlockMirror copy interface, kv_cache.h).
//
// Copies are queued into groups of one direction (at most kMaxGroup blocks; a full group is
// submitted at once, so a long run of copies overlaps itself). Pulls run on one stream of the
// copier's, pushes on another, so both directions of the link are busy at once. A submitted
// group first waits for everything queued on the compute stream so far (an event); a push
// group also waits for the pull groups still reading any of its blocks; then
//   pulls (device -> host): one checksum kernel over the group's blocks, then the copies;
//   pushes (host -> device): the copies, then the checksum kernel over the blocks as landed;
// (the copies as one cudaMemcpyBatchAsync where the runtime has it) and records an end event.
// Checksums (kv/checksum_mix.h) are written by the kernel straight into mapped page-locked
// memory, so completing a group needs no further copy. Groups of one direction run in queue
// order; done() may report a later group of the other direction before an earlier one.
//
// Write-after-read: a block whose pull has not completed may already be back in the pool.
// Before the compute stream writes into blocks (a forward, or the replay of logged
// copy-on-write copies and slot moves), fence_writes() makes it wait (on the device, never the
// host) for the pull groups of just those blocks.
//
// Units: bytes, milliseconds. Errors: CUDA failures throw CudaError; a block outside the arena
// throws std::logic_error. Thread-safety: none (the thread that runs the model).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cuda/block_checksum.h"
#include "flashdllm/kv_cache.h"

namespace fdl::cuda {

class TierCopier {
 public:
  static constexpr size_t kMaxGroup = 256;  ///< blocks per group (4 KiB of ids and sums)
  using Handle = BlockMirror::CopyHandle;

  /// `compute`: the stream the model's forwards run on. `before_pull` runs before a pull is
  /// queued (the model replays its pending copy-on-write log there, so the pull sees what was
  /// logged before it; what is logged after it waits for it: fence_writes).
  TierCopier(cudaStream_t compute, std::function<void()> before_pull);
  ~TierCopier();  ///< waits for the copy stream
  TierCopier(const TierCopier&) = delete;
  TierCopier& operator=(const TierCopier&) = delete;

  /// The arena the copies address. Waits for every group in flight first.
  void set_arena(uint8_t* base, size_t block_bytes, size_t n_blocks);
  Handle queue(BlockId id, uint8_t* host, bool to_host);
  void flush();
  bool done(Handle h);
  void wait(Handle h);
  uint64_t collect(Handle h);
  /// Whether pulls may still read blocks (fence_writes has work to do).
  bool pulls_pending() const { return !pulling_.empty(); }
  /// The compute stream waits for the pulls still reading any of `written`.
  void fence_writes(std::span<const BlockId> written);
  BlockMirror::CopyTotals totals() const { return totals_; }
  /// Best of three timed transfers of `bytes` each way between the arena and `host`
  /// (page-locked): {host -> device, device -> host} in bytes per second.
  std::pair<double, double> measure_link(uint8_t* host, size_t bytes);
  /// Waits for every submitted group (not collecting them).
  void synchronize();

 private:
  struct Buffers {  // mapped page-locked ids and sums of one group
    int32_t* ids = nullptr;
    uint64_t* sums = nullptr;
  };
  struct Group {
    uint64_t id = 0;
    bool to_host = false;
    std::vector<BlockId> blocks;
    std::vector<uint8_t*> hosts;
    Buffers buf;
    cudaEvent_t start = nullptr, end = nullptr;
    bool submitted = false, completed = false;
    size_t collected = 0;
  };
  Group& group(uint64_t id);
  Group& open_group(bool to_host);
  void submit(Group& g);
  bool poll(Group& g);  // marks g completed when its end event has passed
  void copy_group(Group& g, cudaStream_t st);
  void retire_front();
  Buffers take_buffers();

  cudaStream_t compute_;
  cudaStream_t d2h_ = nullptr, h2d_ = nullptr;
  bool batch_copies_ = true;
  std::vector<const void*> srcs_;
  std::vector<void*> dsts_;
  std::vector<size_t> sizes_;
  cudaEvent_t compute_ready_ = nullptr;
  std::function<void()> before_pull_;
  uint8_t* arena_ = nullptr;
  size_t block_bytes_ = 0, n_blocks_ = 0;
  std::deque<Group> groups_;  // by id, oldest first; retired when completed and collected
  uint64_t next_id_ = 1;
  std::vector<Buffers> free_buffers_;
  std::vector<Buffers> all_buffers_;
  std::vector<cudaEvent_t> free_events_;
  std::unordered_map<BlockId, uint64_t> pulling_;  // block -> latest pull group reading it
  BlockMirror::CopyTotals totals_;
};

}  // namespace fdl::cuda
