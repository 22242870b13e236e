// request_stream.h — the hand-off between the engine thread (which delivers RequestOutput to
// a sink) and the HTTP thread that answers one request (which sends chunks or waits for the
// whole result).
//
// Why a queue: an engine sink must return at once and must not block on a slow client, so it
// only appends to this queue; the HTTP thread drains it at its own pace. The object is held
// by shared_ptr from both sides, so whichever finishes last frees it (a sink may still fire
// after the HTTP side gave up on a vanished client).
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <vector>

#include "flashdllm/engine.h"

namespace fdl::server {

class RequestStream {
 public:
  struct Event {
    size_t choice = 0;  ///< which of the n engine requests
    RequestOutput output;
  };

  explicit RequestStream(size_t n_choices) : n_choices_(n_choices) {}

  /// Called by the engine's sink for choice `choice` (engine thread). Never blocks long.
  void push(size_t choice, const RequestOutput& output);

  /// Waits up to `timeout` for events; returns all queued ones (empty on timeout).
  std::vector<Event> pop(std::chrono::milliseconds timeout);

  /// True once every choice has delivered its final output (queued or already popped).
  bool all_finished() const;

 private:
  const size_t n_choices_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
  size_t finished_ = 0;
};

}  // namespace fdl::server
