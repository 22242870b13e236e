#include "server/request_stream.h"

namespace fdl::server {

void RequestStream::push(size_t choice, const RequestOutput& output) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(Event{choice, output});
    if (output.finished) ++finished_;
  }
  cv_.notify_all();
}

std::vector<RequestStream::Event> RequestStream::pop(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !events_.empty(); });
  std::vector<Event> out(std::make_move_iterator(events_.begin()),
                         std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

bool RequestStream::all_finished() const {
  std::lock_guard lock(mu_);
  return finished_ >= n_choices_;
}

}  // namespace fdl::server
