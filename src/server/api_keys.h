// api_keys.h — the API keys a server accepts, which one a request presented, and what an
// address exposes when none is set.
//
// Several keys may be configured (one per tenant); the index of the key that authenticated a
// request is its identity for the prefix cache (cache_scope), so tenants never share KV and
// the key itself is never kept anywhere but here.
// Thread-safety: ApiKeys is immutable after construction; every function here is pure.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fdl::server {

class ApiKeys {
 public:
  ApiKeys() = default;
  /// Throws std::invalid_argument for an empty key or a key with whitespace or control
  /// characters (it could never be sent in an Authorization header as written).
  explicit ApiKeys(std::vector<std::string> keys);

  bool empty() const { return keys_.empty(); }
  size_t size() const { return keys_.size(); }

  /// The index of the key an `Authorization` header value ("Bearer KEY") presents, or
  /// nullopt. Compares against every key in constant time per key, so response times say
  /// neither how much of a key matched nor which key it was.
  std::optional<size_t> match(std::string_view authorization) const;

  /// The prefix-cache scope of a request with this `Authorization` header: "key-N" for the
  /// N-th key, "" (one shared scope) when no keys are configured or none matches.
  std::string cache_scope(std::string_view authorization) const;

 private:
  std::vector<std::string> keys_;
};

/// The keys in a key file's text: one per line, surrounding whitespace stripped, blank lines
/// skipped (a password file: the first of them). Throws std::invalid_argument when there is none.
std::vector<std::string> parse_key_lines(std::string_view text);

/// True for addresses only this host can reach: "localhost", 127.0.0.0/8, ::1 (also as
/// "[::1]" or an IPv4-mapped ::ffff:127.x.y.z). Anything else, host names included, may be
/// reachable from outside.
bool is_loopback_host(std::string_view host);

/// The warning to print when binding `host` with no API key, or "" when there is nothing to
/// warn about (a key is set, or the address is loopback).
std::string exposure_warning(std::string_view host, bool has_api_key);

}  // namespace fdl::server
