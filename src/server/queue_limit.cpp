#include "server/queue_limit.h"

namespace fdl::server {

std::optional<QueueLimit::Reservation> QueueLimit::admit(int64_t n, const std::function<int64_t()>& waiting) {
  if (max_ <= 0) return Reservation(nullptr, 0);
  // Reserve before reading the snapshot: a request that reserves later reads a snapshot
  // taken later, which holds this one if it was submitted by then.
  const int64_t others = pending_.fetch_add(n);
  Reservation r(&pending_, n);
  if (waiting() + others >= max_) return std::nullopt;  // r gives the reservation back
  return r;
}

}  // namespace fdl::server
