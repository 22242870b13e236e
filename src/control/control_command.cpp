// control_command.cpp — strict parsers for control messages and the Redis control URL.
#include "control/control_command.h"

#include <nlohmann/json.hpp>

#include <cctype>
#include <charconv>
#include <set>
#include <stdexcept>

namespace fdl::control {

namespace {

constexpr size_t kMaxMessageBytes = 64 * 1024;  // a command is ~100 B; anything huge is abuse

[[noreturn]] void bad_command(const std::string& why) {
  throw std::invalid_argument("control command: " + why);
}

[[noreturn]] void bad_url(std::string_view url, const std::string& why) {
  throw std::invalid_argument("control Redis URL '" + std::string(url) + "': " + why +
                              " (expected redis://HOST[:PORT]/CHANNEL)");
}

// A short, printable excerpt of untrusted input for error messages.
std::string excerpt(std::string_view s) {
  std::string o;
  for (char c : s.substr(0, 60)) o += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > 60) o += "...";
  return o;
}

const char* json_type(const nlohmann::json& j) { return j.type_name(); }

}  // namespace

ControlCommand parse_control_command(std::string_view json) {
  if (json.size() > kMaxMessageBytes)
    bad_command("message is " + std::to_string(json.size()) + " bytes, limit is " +
                std::to_string(kMaxMessageBytes));

  // nlohmann keeps the last of duplicate keys silently; a duplicated "action" could hide the
  // operator's intent, so the parser callback rejects duplicates of top-level keys.
  std::set<std::string> seen;
  std::string duplicate;
  auto cb = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    if (ev == nlohmann::json::parse_event_t::key && depth == 1) {
      const std::string key = parsed.get<std::string>();
      if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json.begin(), json.end(), cb);
  } catch (const nlohmann::json::exception& e) {
    bad_command(std::string("invalid JSON: ") + e.what());
  }
  if (!j.is_object())
    bad_command(std::string("expected a JSON object, got ") + json_type(j));
  if (!duplicate.empty()) bad_command("duplicate field \"" + duplicate + "\"");

  for (const auto& [key, value] : j.items()) {
    if (key != "breaker" && key != "action" && key != "reason")
      bad_command("unknown field \"" + excerpt(key) +
                  "\" (allowed: \"breaker\", \"action\", \"reason\")");
  }
  auto required_string = [&](const char* key) -> std::string {
    auto it = j.find(key);
    if (it == j.end()) bad_command(std::string("missing field \"") + key + "\"");
    if (!it->is_string())
      bad_command(std::string("field \"") + key + "\" must be a string, got " + json_type(*it));
    return it->get<std::string>();
  };

  ControlCommand c;
  c.breaker = required_string("breaker");
  if (c.breaker.empty()) bad_command("field \"breaker\" is empty");
  c.action = required_string("action");
  if (c.action != "trip" && c.action != "reset")
    bad_command("unknown action \"" + excerpt(c.action) + "\" (expected \"trip\" or \"reset\")");
  if (auto it = j.find("reason"); it != j.end() && !it->is_null()) {  // null: as if absent
    if (!it->is_string())
      bad_command(std::string("field \"reason\" must be a string, got ") + json_type(*it));
    c.reason = it->get<std::string>();
    // It is kept and echoed in every breaker listing and /metrics scrape: bounded.
    if (c.reason.size() > kMaxReasonBytes)
      bad_command("field \"reason\" has " + std::to_string(c.reason.size()) + " bytes (limit is " +
                  std::to_string(kMaxReasonBytes) + ")");
  }
  return c;
}

RedisUrl parse_redis_url(std::string_view url) {
  constexpr std::string_view kScheme = "redis://";
  if (url.empty()) bad_url(url, "empty");
  for (char c : url)
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f)
      bad_url(url, "contains whitespace, control or non-ASCII characters");
  if (url.substr(0, 9) == "rediss://") bad_url(url, "TLS (rediss://) is not supported");
  if (url.substr(0, kScheme.size()) != kScheme) bad_url(url, "must start with redis://");
  std::string_view rest = url.substr(kScheme.size());
  if (rest.find('?') != std::string_view::npos) bad_url(url, "query strings are not supported");
  if (rest.find('#') != std::string_view::npos) bad_url(url, "fragments are not supported");

  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (authority.find('@') != std::string_view::npos)
    bad_url(url, "user/password in the URL is not supported");
  if (authority.empty()) bad_url(url, "missing host");

  RedisUrl r;
  std::string_view host, port;
  bool has_port = false;
  if (authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) bad_url(url, "unterminated '[' in IPv6 host");
    host = authority.substr(1, close - 1);
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') bad_url(url, "unexpected characters after ']'");
      has_port = true;
      port = after.substr(1);
    }
    if (host.empty()) bad_url(url, "empty IPv6 host");
  } else {
    const size_t colon = authority.find(':');
    host = authority.substr(0, colon);
    if (colon != std::string_view::npos) {
      has_port = true;
      port = authority.substr(colon + 1);
      if (port.find(':') != std::string_view::npos)
        bad_url(url, "more than one ':' (put IPv6 addresses in brackets)");
    }
    if (host.empty()) bad_url(url, "missing host");
    for (char c : host)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_'))
        bad_url(url, std::string("invalid character '") + c + "' in host");
  }
  r.host = std::string(host);

  if (has_port) {
    if (port.empty()) bad_url(url, "empty port after ':'");
    int p = 0;
    auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
    if (ec == std::errc::result_out_of_range && ptr == port.data() + port.size())
      bad_url(url, "port " + std::string(port) + " is outside 1..65535");
    if (ec != std::errc() || ptr != port.data() + port.size())
      bad_url(url, "port '" + std::string(port) + "' is not a number");
    if (p < 1 || p > 65535) bad_url(url, "port " + std::string(port) + " is outside 1..65535");
    r.port = p;
  }

  if (slash == std::string_view::npos) bad_url(url, "missing /CHANNEL");
  std::string_view channel = rest.substr(slash + 1);
  if (channel.empty()) bad_url(url, "empty channel name after '/'");
  r.channel = std::string(channel);
  return r;
}

}  // namespace fdl::control
