// kv_uid.h — process-unique ids for BlockPool and KvCache objects (BlockPool::uid): a backend
// keeping state per pool or cache tells a new object from a dead one at the same address.
#pragma once

#include <cstdint>

namespace fdl {

/// 1, 2, 3, ... across every pool and cache of the process; thread-safe.
uint64_t next_kv_uid();

}  // namespace fdl
