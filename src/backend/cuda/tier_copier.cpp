// TierCopier: asynchronous KV block copies for the KV tiers (see tier_copier.h).
#include "backend/cuda/tier_copier.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "backend/cuda/cuda_check.h"

namespace fdl::cuda {

TierCopier::TierCopier(cudaStream_t compute, std::function<void()> before_pull)
    : compute_(compute), before_pull_(std::move(before_pull)) {
  FDL_CUDA_CHECK(cudaStreamCreateWithFlags(&d2h_, cudaStreamNonBlocking));
  FDL_CUDA_CHECK(cudaStreamCreateWithFlags(&h2d_, cudaStreamNonBlocking));
  FDL_CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
}

TierCopier::~TierCopier() {
  if (d2h_) cudaStreamSynchronize(d2h_);
  if (h2d_) cudaStreamSynchronize(h2d_);
  for (Group& g : groups_) {
    if (g.start) cudaEventDestroy(g.start);
    if (g.end) cudaEventDestroy(g.end);
  }
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  for (const Buffers& b : all_buffers_) {
    cudaFreeHost(b.ids);
    cudaFreeHost(b.sums);
  }
  if (compute_ready_) cudaEventDestroy(compute_ready_);
  if (d2h_) cudaStreamDestroy(d2h_);
  if (h2d_) cudaStreamDestroy(h2d_);
}

void TierCopier::synchronize() {
  FDL_CUDA_CHECK(cudaStreamSynchronize(d2h_));
  FDL_CUDA_CHECK(cudaStreamSynchronize(h2d_));
}

void TierCopier::set_arena(uint8_t* base, size_t block_bytes, size_t n_blocks) {
  if (block_bytes % 8 != 0)
    throw std::logic_error("TierCopier: block bytes must be a multiple of 8, got " + std::to_string(block_bytes));
  synchronize();
  for (Group& g : groups_) g.completed = g.submitted;  // the streams are idle
  pulling_.clear();
  arena_ = base;
  block_bytes_ = block_bytes;
  n_blocks_ = n_blocks;
}

TierCopier::Buffers TierCopier::take_buffers() {
  if (!free_buffers_.empty()) {
    const Buffers b = free_buffers_.back();
    free_buffers_.pop_back();
    return b;
  }
  Buffers b;
  FDL_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&b.ids), kMaxGroup * sizeof(int32_t), cudaHostAllocMapped));
  if (cudaHostAlloc(reinterpret_cast<void**>(&b.sums), kMaxGroup * sizeof(uint64_t), cudaHostAllocMapped) !=
      cudaSuccess) {
    cudaFreeHost(b.ids);
    (void)cudaGetLastError();
    throw CudaError("TierCopier: cannot allocate page-locked checksum buffers");
  }
  all_buffers_.push_back(b);
  return b;
}

TierCopier::Group& TierCopier::group(uint64_t id) {
  if (groups_.empty() || id < groups_.front().id || id >= groups_.front().id + groups_.size())
    throw std::logic_error("TierCopier: copy group " + std::to_string(id) + " is not live");
  return groups_[size_t(id - groups_.front().id)];
}

TierCopier::Group& TierCopier::open_group(bool to_host) {
  if (!groups_.empty()) {
    Group& last = groups_.back();
    if (!last.submitted) {
      if (last.to_host == to_host && last.blocks.size() < kMaxGroup) return last;
      submit(last);
    }
  }
  Group g;
  g.id = next_id_++;
  g.to_host = to_host;
  g.buf = take_buffers();
  g.blocks.reserve(kMaxGroup);
  g.hosts.reserve(kMaxGroup);
  groups_.push_back(std::move(g));
  return groups_.back();
}

TierCopier::Handle TierCopier::queue(BlockId id, uint8_t* host, bool to_host) {
  if (arena_ == nullptr || id < 0 || size_t(id) >= n_blocks_)
    throw std::logic_error("TierCopier: block " + std::to_string(id) + " is not in the device arena");
  // A pull reads the block as the host left it: copy-on-write copies and slot moves logged
  // before it go on the compute stream first (the group waits for the compute stream).
  if (to_host && before_pull_) before_pull_();
  Group& g = open_group(to_host);
  const Handle h{g.id, uint32_t(g.blocks.size())};
  g.buf.ids[g.blocks.size()] = id;
  g.blocks.push_back(id);
  g.hosts.push_back(host);
  const auto previous = to_host ? pulling_.find(id) : pulling_.end();
  const uint64_t previous_group = previous != pulling_.end() ? previous->second : 0;
  if (to_host) pulling_[id] = g.id;
  // A full group goes now: the next group's copies overlap this one's.
  if (g.blocks.size() == kMaxGroup) {
    try {
      submit(g);
    } catch (...) {  // the copy was not queued after all: the caller keeps its memory
      g.blocks.pop_back();
      g.hosts.pop_back();
      if (to_host) {
        if (previous_group != 0)
          pulling_[id] = previous_group;
        else
          pulling_.erase(id);
      }
      throw;
    }
  }
  return h;
}

void TierCopier::flush() {
  if (!groups_.empty() && !groups_.back().submitted) submit(groups_.back());
}

void TierCopier::submit(Group& g) {
  auto event = [&]() {
    cudaEvent_t e = nullptr;
    if (!free_events_.empty()) {
      e = free_events_.back();
      free_events_.pop_back();
    } else {
      FDL_CUDA_CHECK(cudaEventCreate(&e));  // timed: the live GB/s figures
    }
    return e;
  };
  if (!g.start) g.start = event();
  if (!g.end) g.end = event();
  const cudaStream_t st = g.to_host ? d2h_ : h2d_;
  // After every forward queued so far: they write the blocks a pull reads and may still read
  // the old contents of a block a push overwrites.
  FDL_CUDA_CHECK(cudaEventRecord(compute_ready_, compute_));
  FDL_CUDA_CHECK(cudaStreamWaitEvent(st, compute_ready_, 0));
  if (!g.to_host) {
    // Pulls run on the other stream: a push into a block whose pull has not run waits for
    // it (pull groups complete in order, so the latest one covers the rest).
    uint64_t need = 0;
    for (BlockId b : g.blocks)
      if (const auto it = pulling_.find(b); it != pulling_.end()) need = std::max(need, it->second);
    if (need != 0) {
      Group& p = group(need);
      if (!p.submitted) submit(p);
      if (!poll(p)) FDL_CUDA_CHECK(cudaStreamWaitEvent(st, p.end, 0));
    }
  }
  FDL_CUDA_CHECK(cudaEventRecord(g.start, st));
  const int n = int(g.blocks.size());
  if (g.to_host) launch_block_checksums(arena_, block_bytes_, g.buf.ids, n, g.buf.sums, st);
  copy_group(g, st);
  if (!g.to_host) launch_block_checksums(arena_, block_bytes_, g.buf.ids, n, g.buf.sums, st);
  FDL_CUDA_CHECK(cudaEventRecord(g.end, st));
  g.submitted = true;
}

void TierCopier::copy_group(Group& g, cudaStream_t st) {
  const size_t n = g.blocks.size();
  srcs_.resize(n);
  dsts_.resize(n);
  sizes_.assign(n, block_bytes_);
  for (size_t i = 0; i < n; ++i) {
    uint8_t* dev = arena_ + size_t(g.blocks[i]) * block_bytes_;
    srcs_[i] = g.to_host ? static_cast<const void*>(dev) : g.hosts[i];
    dsts_[i] = g.to_host ? static_cast<void*>(g.hosts[i]) : dev;
  }
  // One call for the group where the runtime has it (CUDA 12.8+): the copies are independent
  // (distinct blocks, distinct host slots); else one cudaMemcpyAsync each.
  if (batch_copies_ && n > 1) {
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t attr_idx = 0;
    if (cudaMemcpyBatchAsync(dsts_.data(), srcs_.data(), sizes_.data(), n, &attr, &attr_idx, 1, st) == cudaSuccess)
      return;
    (void)cudaGetLastError();
    batch_copies_ = false;  // not supported here: per-copy calls from now on
  }
  for (size_t i = 0; i < n; ++i)
    FDL_CUDA_CHECK(cudaMemcpyAsync(dsts_[i], srcs_[i], block_bytes_, g.to_host ? cudaMemcpyDeviceToHost
                                                                                   : cudaMemcpyHostToDevice, st));
}

bool TierCopier::poll(Group& g) {
  if (g.completed) return true;
  if (!g.submitted) submit(g);
  const cudaError_t e = cudaEventQuery(g.end);
  if (e == cudaErrorNotReady) return false;
  FDL_CUDA_CHECK(e);
  g.completed = true;
  float ms = 0;
  if (cudaEventElapsedTime(&ms, g.start, g.end) != cudaSuccess) (void)cudaGetLastError();
  const int dir = g.to_host ? 0 : 1;
  totals_.bytes[dir] += uint64_t(g.blocks.size()) * block_bytes_;
  totals_.device_ms[dir] += double(ms);
  ++totals_.groups[dir];
  if (g.to_host)
    for (BlockId b : g.blocks) {
      const auto it = pulling_.find(b);
      if (it != pulling_.end() && it->second == g.id) pulling_.erase(it);
    }
  return true;
}

bool TierCopier::done(Handle h) {
  Group& g = group(h.group);
  if (!g.submitted) submit(g);  // the open group
  return poll(g);
}

void TierCopier::wait(Handle h) {
  Group& g = group(h.group);
  if (!g.submitted) submit(g);
  if (!g.completed) FDL_CUDA_CHECK(cudaEventSynchronize(g.end));
  poll(g);
}

uint64_t TierCopier::collect(Handle h) {
  Group& g = group(h.group);
  if (!poll(g)) throw std::logic_error("TierCopier: collecting a copy that has not completed");
  if (h.index >= g.blocks.size()) throw std::logic_error("TierCopier: bad copy index");
  const uint64_t sum = g.buf.sums[h.index];
  ++g.collected;
  retire_front();
  return sum;
}

void TierCopier::retire_front() {
  while (!groups_.empty() && groups_.front().completed && groups_.front().collected >= groups_.front().blocks.size()) {
    Group& g = groups_.front();
    free_buffers_.push_back(g.buf);
    free_events_.push_back(g.start);
    free_events_.push_back(g.end);
    groups_.pop_front();
  }
}

void TierCopier::fence_writes(std::span<const BlockId> written) {
  if (pulling_.empty()) return;
  flush();
  uint64_t need = 0;
  for (BlockId b : written) {
    const auto it = pulling_.find(b);
    if (it != pulling_.end()) need = std::max(need, it->second);
  }
  if (need == 0) return;
  Group& g = group(need);
  if (!poll(g)) FDL_CUDA_CHECK(cudaStreamWaitEvent(compute_, g.end, 0));
}

std::pair<double, double> TierCopier::measure_link(uint8_t* host, size_t bytes) {
  bytes = std::min(bytes, block_bytes_ * n_blocks_);
  if (arena_ == nullptr || host == nullptr || bytes == 0) return {0, 0};
  synchronize();
  FDL_CUDA_CHECK(cudaStreamSynchronize(compute_));
  const cudaStream_t copy = h2d_;
  cudaEvent_t a = nullptr, b = nullptr;
  FDL_CUDA_CHECK(cudaEventCreate(&a));
  FDL_CUDA_CHECK(cudaEventCreate(&b));
  double best[2] = {0, 0};
  for (int rep = 0; rep < 3; ++rep)
    for (int dir = 0; dir < 2; ++dir) {
      FDL_CUDA_CHECK(cudaEventRecord(a, copy));
      if (dir == 0)
        FDL_CUDA_CHECK(cudaMemcpyAsync(arena_, host, bytes, cudaMemcpyHostToDevice, copy));
      else
        FDL_CUDA_CHECK(cudaMemcpyAsync(host, arena_, bytes, cudaMemcpyDeviceToHost, copy));
      FDL_CUDA_CHECK(cudaEventRecord(b, copy));
      FDL_CUDA_CHECK(cudaEventSynchronize(b));
      float ms = 0;
      FDL_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
      if (ms > 0) best[dir] = std::max(best[dir], double(bytes) / (double(ms) * 1e-3));
    }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return {best[0], best[1]};
}

}  // namespace fdl::cuda
