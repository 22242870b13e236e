// Spin-then-sleep thread pool with chunk claiming; see thread_pool.h for the rationale.
#include "backend/cpu/thread_pool.h"

#include <algorithm>
#include <stdexcept>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace fdl::cpu {
namespace {

// Polls a worker makes for the next job before sleeping: ~100 µs (one PAUSE is ~25 ns on the
// Zen 4 dev machine), enough to bridge the serial gaps between the kernels of one decode
// step, short enough that an idle pool stops burning cores almost at once.
constexpr int kWorkerSpins = 4000;
// Polls the caller makes for a chunk still running elsewhere before it starts yielding the
// core (that thread may be preempted, e.g. when the machine is oversubscribed).
constexpr int kCallerSpins = 4000;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

constexpr uint64_t kChunkMask = 0xffffu;      // next unclaimed chunk: bits 0..15
constexpr int kCountShift = 16;               // chunk count: bits 16..31
constexpr int64_t kMaxChunks = 0xffff;

// The pool whose job the current thread is running (workers: always their own pool), to
// reject nested parallel_for calls that would otherwise deadlock.
thread_local const ThreadPool* tl_active_pool = nullptr;

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads < 0) throw std::invalid_argument("ThreadPool: n_threads must be >= 0");
  if (n_threads == 0) n_threads = static_cast<int>(std::thread::hardware_concurrency());
  n_threads_ = n_threads > 0 ? n_threads : 1;
  errors_.resize(static_cast<size_t>(n_threads_));
  workers_.reserve(static_cast<size_t>(n_threads_ - 1));
  // Workers start from job 0 rather than whatever they read once running: a pool destroyed
  // before a worker got scheduled must still wake it.
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_loop(0); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_seq_cst);
  job_id_.fetch_add(1, std::memory_order_seq_cst);
  job_id_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_claimed_chunks(uint32_t job_id) {
  uint64_t w = work_.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t n_chunks = (w >> kCountShift) & kChunkMask;
    if ((w >> 32) != job_id || (w & kChunkMask) >= n_chunks) return;
    if (!work_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire))
      continue;
    // Claimed: the job's fields stay valid until this chunk is reported finished.
    const auto chunk = static_cast<int64_t>(w & kChunkMask);
    const auto chunks = static_cast<int64_t>(n_chunks);
    const int64_t q = job_n_ / chunks, m = job_n_ % chunks;
    const int64_t begin = chunk * q + std::min(chunk, m);
    const int64_t end = begin + q + (chunk < m ? 1 : 0);
    try {
      (*job_fn_)(begin, end, static_cast<int>(chunk));
    } catch (...) {
      errors_[static_cast<size_t>(chunk)] = std::current_exception();
    }
    unfinished_.fetch_sub(1, std::memory_order_acq_rel);
    w = work_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_loop(uint32_t seen) {
  tl_active_pool = this;
  for (;;) {
    uint32_t now = seen;
    for (int spin = 0; spin < kWorkerSpins; ++spin) {
      now = job_id_.load(std::memory_order_acquire);
      if (now != seen) break;
      cpu_relax();
    }
    if (now == seen) {
      // Announce the sleep before re-checking, so a caller that publishes a job either sees
      // us in sleepers_ (and notifies) or we see its job (seq_cst on both sides).
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      while ((now = job_id_.load(std::memory_order_seq_cst)) == seen) job_id_.wait(seen);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
    seen = now;
    if (stop_.load(std::memory_order_acquire)) return;
    run_claimed_chunks(now);
  }
}

void ThreadPool::parallel_for(int64_t n, const RangeFn& fn, int chunks_per_thread) {
  if (chunks_per_thread < 1) throw std::invalid_argument("ThreadPool::parallel_for: chunks_per_thread must be >= 1");
  if (n <= 0) return;
  if (tl_active_pool == this)
    throw std::logic_error("ThreadPool::parallel_for called from inside a parallel_for body");
  std::lock_guard lock(call_mutex_);
  struct ActiveGuard {
    const ThreadPool* saved = tl_active_pool;
    explicit ActiveGuard(const ThreadPool* p) { tl_active_pool = p; }
    ~ActiveGuard() { tl_active_pool = saved; }
  } active(this);

  // Empty chunks are never formed: at most n chunks.
  const int64_t n_chunks = std::min({n, int64_t{n_threads_} * chunks_per_thread, kMaxChunks});
  // One thread, or one chunk, needs no hand-off.
  if (n_threads_ == 1 || n_chunks == 1) {
    fn(0, n, 0);
    return;
  }
  if (errors_.size() < static_cast<size_t>(n_chunks)) errors_.resize(static_cast<size_t>(n_chunks));
  const uint32_t id = job_id_.load(std::memory_order_relaxed) + 1;
  job_fn_ = &fn;
  job_n_ = n;
  for (auto& e : errors_) e = nullptr;
  unfinished_.store(static_cast<int>(n_chunks), std::memory_order_relaxed);
  work_.store((static_cast<uint64_t>(id) << 32) | (static_cast<uint64_t>(n_chunks) << kCountShift),
              std::memory_order_release);
  job_id_.store(id, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) job_id_.notify_all();

  run_claimed_chunks(id);
  for (int spin = 0; unfinished_.load(std::memory_order_acquire) != 0; ++spin) {
    if (spin < kCallerSpins) cpu_relax();
    else std::this_thread::yield();
  }
  job_fn_ = nullptr;
  for (auto& e : errors_)
    if (e) std::rethrow_exception(e);
}

}  // namespace fdl::cpu
