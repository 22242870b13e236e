#include "server/api_keys.h"

#include <arpa/inet.h>

#include <cstdint>
#include <stdexcept>

namespace fdl::server {
namespace {

constexpr std::string_view kBearer = "Bearer ";
constexpr std::string_view kSpace = " \t\r\n\v\f";

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(kSpace);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kSpace) - b + 1);
}

// Constant-time comparison, so a key cannot be guessed byte by byte from response times.
bool same_secret(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= uint8_t(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

}  // namespace

ApiKeys::ApiKeys(std::vector<std::string> keys) : keys_(std::move(keys)) {
  for (size_t i = 0; i < keys_.size(); ++i) {
    if (keys_[i].empty()) throw std::invalid_argument("API key " + std::to_string(i + 1) + " is empty");
    for (const char c : keys_[i])
      if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)
        throw std::invalid_argument("API key " + std::to_string(i + 1) +
                                    " contains whitespace or control characters");
  }
}

std::optional<size_t> ApiKeys::match(std::string_view authorization) const {
  if (!authorization.starts_with(kBearer)) return std::nullopt;
  const std::string_view given = authorization.substr(kBearer.size());
  std::optional<size_t> found;
  for (size_t i = 0; i < keys_.size(); ++i)  // no early exit: every key is compared
    if (same_secret(given, keys_[i]) && !found) found = i;
  return found;
}

std::string ApiKeys::cache_scope(std::string_view authorization) const {
  const std::optional<size_t> i = match(authorization);
  return i ? "key-" + std::to_string(*i) : std::string();
}

std::vector<std::string> parse_key_lines(std::string_view text) {
  std::vector<std::string> keys;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    const std::string_view line = trim(text.substr(0, nl));
    if (!line.empty()) keys.emplace_back(line);
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  if (keys.empty()) throw std::invalid_argument("is empty or holds only blank lines");
  return keys;
}

bool is_loopback_host(std::string_view host) {
  if (host == "localhost") return true;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string h(host);
  in_addr v4{};
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;  // a host name other than localhost may resolve to anything
}

std::string exposure_warning(std::string_view host, bool has_api_key) {
  if (has_api_key || is_loopback_host(host)) return {};
  return "serving on " + std::string(host) +
         ", which is not a loopback address, without an API key: anyone who can reach it can use "
         "the model and the admin endpoints (set --api-key-file or FLASHDLLM_API_KEY)";
}

}  // namespace fdl::server
