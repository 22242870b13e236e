// thread_pool.h — a fixed set of worker threads for data-parallel loops with microsecond
// dispatch latency.
//
// A decode step of a small model issues ~50 parallel loops of a few microseconds each, so
// waking threads through the kernel on every call would dominate. Workers therefore spin on
// an atomic job counter for a short while after each job (catching the next loop of the
// same step), then fall back to a futex wait (std::atomic::wait) so an idle engine costs no
// CPU. Chunks are claimed, not pinned to threads: if a worker is slow to wake (or the core
// is shared with other processes), the caller runs its chunk instead of waiting for it.
//
// Thread-safety: parallel_for may be called from any thread; calls from different threads
// are serialized (one job runs at a time). Calling parallel_for on the same pool from inside
// a loop body is rejected with std::logic_error (it would deadlock).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fdl::cpu {

class ThreadPool {
 public:
  /// Loop body: processes indices [begin, end). `chunk` is the chunk's index, in
  /// [0, size() * chunks_per_thread); no two invocations of one parallel_for share it, so with
  /// the default of one chunk per thread it can select per-thread scratch.
  using RangeFn = std::function<void(int64_t begin, int64_t end, int chunk)>;

  /// `n_threads` threads in total including the calling thread; 0 = hardware concurrency.
  /// Throws std::invalid_argument if n_threads < 0.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Number of threads that take part in a parallel_for (workers + the caller).
  int size() const { return n_threads_; }

  /// Splits [0, n) into size() * chunks_per_thread contiguous chunks in index order (at most
  /// n, at most 65535) — with c chunks, q = n / c and m = n % c, chunk i holds q + (i < m)
  /// indices — and calls fn once per non-empty chunk. Chunks are claimed in order by the
  /// calling thread and the workers as each becomes free, so with chunks_per_thread > 1 a
  /// thread that is slowed down (another process on its core) simply takes fewer chunks.
  /// The split depends only on n, size() and chunks_per_thread, never on timing. Returns
  /// when all chunks are done. If fn throws, the exception of the lowest-numbered failing
  /// chunk is rethrown here after every chunk has finished. n <= 0 does nothing.
  /// Throws std::invalid_argument if chunks_per_thread < 1.
  void parallel_for(int64_t n, const RangeFn& fn, int chunks_per_thread = 1);

 private:
  void worker_loop(uint32_t seen_job);
  // Claims and runs chunks of job `job_id` until none is left.
  void run_claimed_chunks(uint32_t job_id);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // serializes concurrent callers

  // The current job; written by the caller before the job is published in `work_` (release)
  // and only read by a thread after it claimed a chunk of that job (acquire), so the caller
  // cannot overwrite it meanwhile (it waits for every claimed chunk to finish).
  const RangeFn* job_fn_ = nullptr;
  int64_t job_n_ = 0;
  std::vector<std::exception_ptr> errors_;  // one slot per chunk; grows, never shrinks

  // (job id << 32) | (chunk count << 16) | next unclaimed chunk. Tagging the counter with the
  // job id keeps a worker that woke late for an old job from claiming chunks of a newer one;
  // carrying the chunk count lets a worker test for work without reading job fields.
  alignas(64) std::atomic<uint64_t> work_{0};
  alignas(64) std::atomic<uint32_t> job_id_{0};   // futex word workers sleep on
  alignas(64) std::atomic<int> unfinished_{0};    // chunks of the current job not yet done
  alignas(64) std::atomic<int> sleepers_{0};      // workers blocked in a futex wait
  std::atomic<bool> stop_{false};
};

}  // namespace fdl::cpu
