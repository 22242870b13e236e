#include "server/content_length.h"

#include <cstdint>
#include <string>

#include "server/openai_error.h"

namespace fdl::server {

void check_content_length(std::string_view value, size_t max_body_bytes) {
  // 19 digits always fit in 64 bits; longer values are refused rather than saturated.
  bool digits = !value.empty() && value.size() <= 19;
  uint64_t bytes = 0;
  for (const char c : value) {
    if (c < '0' || c > '9') {
      digits = false;
      break;
    }
    bytes = bytes * 10 + uint64_t(c - '0');
  }
  std::string shown(value.substr(0, 40));
  if (value.size() > 40) shown += "...";
  if (!digits)
    throw ApiError(400, "invalid Content-Length header '" + shown + "': expected a byte count in decimal digits",
                   "Content-Length");
  if (bytes > max_body_bytes)
    throw ApiError(413, "the request body (" + std::to_string(bytes) + " bytes by its Content-Length) is larger than " +
                            "the server accepts (--max-body-bytes " + std::to_string(max_body_bytes) + ")");
}

}  // namespace fdl::server
