// control_command.h — the runtime control messages the server accepts (from Redis Pub/Sub),
// and the parsers for them and for the `--control-redis` URL.
//
// A control command trips or resets one of the engine's circuit breakers, e.g.
//   {"breaker":"disk_offload","action":"trip","reason":"disk latency alarm"}
// The breaker name is not checked here: the engine knows which breakers exist.
//
// Thread-safety: both parsers are pure functions, safe from any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace fdl::control {

struct ControlCommand {
  std::string breaker;  ///< non-empty breaker name, e.g. "disk_offload"
  std::string action;   ///< "trip" | "reset"
  std::string reason;   ///< free text for logs; empty when absent or null
};

/// Longest accepted breaker reason, in bytes.
inline constexpr size_t kMaxReasonBytes = 512;

/// Parses one JSON control message. Fields: "breaker" (non-empty string, required),
/// "action" ("trip" or "reset", required), "reason" (string of at most kMaxReasonBytes bytes,
/// optional; null counts as absent).
/// Throws std::invalid_argument with a message naming the problem for: invalid JSON, a
/// non-object, a missing or non-string field, an empty breaker, an unknown action, an
/// unknown extra field, a reason over kMaxReasonBytes, or input over 64 KiB.
ControlCommand parse_control_command(std::string_view json);

struct RedisUrl {
  std::string host = "127.0.0.1";
  int port = 6379;
  int db = 0;  ///< not part of the URL syntax below; Pub/Sub ignores the db anyway
  std::string channel = "flashdllm-control";
};

/// Parses "redis://HOST[:PORT]/CHANNEL": the path is the Pub/Sub channel name, as in
/// `--control-redis redis://127.0.0.1:6379/flashdllm-control`. HOST is a host name or IPv4
/// address, or an IPv6 address in brackets ("[::1]"); PORT defaults to 6379 and must be
/// 1..65535; CHANNEL is required, non-empty, printable ASCII without spaces, '/' allowed.
/// User info ("user:pass@"), query strings and fragments are rejected (not supported).
/// Throws std::invalid_argument naming what is wrong.
RedisUrl parse_redis_url(std::string_view url);

}  // namespace fdl::control
