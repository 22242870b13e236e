// queue_limit.h — `--max-queue`: refuses generation requests while the engine already has
// that many requests waiting for admission, so an overloaded server answers 429 at once
// instead of letting the queue (and every waiting client's latency) grow without bound.
//
// The engine's waiting count is a snapshot (Engine::metrics()), and requests arriving together
// read it before any of them is queued. So each request between its check and its submission
// holds a Reservation, and a check counts the reservations of the others too: of two
// concurrent arrivals at least one sees the other, either in the snapshot or as a reservation.
// Thread-safety: admit() may be called from any thread at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>

namespace fdl::server {

class QueueLimit {
 public:
  /// `max_waiting` 0 = unbounded (every request is admitted).
  explicit QueueLimit(int64_t max_waiting) : max_(max_waiting) {}

  /// Held from the check until the request is submitted (or given up).
  class Reservation {
   public:
    Reservation(std::atomic<int64_t>* pending, int64_t n) : pending_(pending), n_(n) {}
    Reservation(Reservation&& o) noexcept : pending_(std::exchange(o.pending_, nullptr)), n_(o.n_) {}
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    Reservation& operator=(Reservation&&) = delete;
    ~Reservation() {
      if (pending_ != nullptr) pending_->fetch_sub(n_);
    }

   private:
    std::atomic<int64_t>* pending_;
    int64_t n_;
  };

  /// Admits a request of `n` engine requests (choices) when fewer than max_waiting are
  /// waiting: `waiting()` (the engine's count) plus the other admitted requests not yet
  /// submitted. nullopt = refuse it. `waiting` is not called when the queue is unbounded.
  std::optional<Reservation> admit(int64_t n, const std::function<int64_t()>& waiting);

  int64_t max_waiting() const { return max_; }

 private:
  const int64_t max_;
  std::atomic<int64_t> pending_{0};
};

}  // namespace fdl::server
