// content_length.h — the Content-Length header check the server runs before cpp-httplib reads
// a request body.
//
// Why: cpp-httplib 0.11 parses Content-Length with strtoull, so "-1" and values past 2^64 become
// huge and the request sits until the read timeout (5 s) before a 413, and "1e3" or "12abc"
// read as 1 and 12 bytes, after which the rest of the body is taken for the next request. The
// value must be what RFC 9110 (section 8.6) says it is: one or more decimal digits.
// Thread-safety: pure function.
#pragma once

#include <cstddef>
#include <string_view>

namespace fdl::server {

/// Throws ApiError 400 (param "Content-Length") unless `value` is 1 to 19 decimal digits
/// (leading zeros allowed), and ApiError 413 (no param, as for any body over the limit) when
/// that byte count exceeds `max_body_bytes`.
void check_content_length(std::string_view value, size_t max_body_bytes);

}  // namespace fdl::server
