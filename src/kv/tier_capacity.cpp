// TierCapacity: tier sizes given as bytes ("512MiB") or as a fraction ("25%", "0.25") of a
// reference size (host RAM, free disk space), and the reference sizes themselves.
#include <sys/statvfs.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "flashdllm/kv_tiers.h"

namespace fdl {
namespace {

[[noreturn]] void bad(std::string_view text, const char* why) {
  throw std::invalid_argument("bad tier capacity '" + std::string(text) + "': " + why +
                              " (use bytes like 536870912, 512MiB, 4GiB, 2GB, or a fraction "
                              "like 25% or 0.25)");
}

uint64_t unit_multiplier(std::string unit, std::string_view text) {
  for (char& c : unit) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (unit.empty() || unit == "b") return 1;
  if (unit == "k" || unit == "kib") return 1ull << 10;
  if (unit == "m" || unit == "mib") return 1ull << 20;
  if (unit == "g" || unit == "gib") return 1ull << 30;
  if (unit == "t" || unit == "tib") return 1ull << 40;
  if (unit == "kb") return 1000ull;
  if (unit == "mb") return 1000ull * 1000;
  if (unit == "gb") return 1000ull * 1000 * 1000;
  if (unit == "tb") return 1000ull * 1000 * 1000 * 1000;
  bad(text, "unknown unit");
}

}  // namespace

TierCapacity TierCapacity::parse(std::string_view text) {
  const std::string s(text);
  if (s.empty()) bad(text, "empty");
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(s, &pos);
  } catch (const std::exception&) {
    bad(text, "not a number");
  }
  if (!std::isfinite(value) || value < 0) bad(text, "must be a finite number >= 0");
  const std::string rest = s.substr(pos);
  TierCapacity c;
  if (rest == "%") {
    if (value > 100) bad(text, "a percentage must be <= 100");
    c.fraction = value / 100.0;
    return c;
  }
  const bool has_point = s.find_first_of(".eE") < pos;
  if (rest.empty() && has_point) {  // a bare fraction like 0.25
    if (value > 1) bad(text, "a fraction must be <= 1 (bytes are whole numbers)");
    c.fraction = value;
    return c;
  }
  const double bytes = value * double(unit_multiplier(rest, text));
  if (bytes >= 1.8e19) bad(text, "too large");
  c.bytes = uint64_t(bytes);
  return c;
}

uint64_t TierCapacity::resolve_bytes(uint64_t reference_bytes) const {
  if (bytes > 0) return bytes;
  if (!(fraction > 0)) return 0;
  return uint64_t(std::floor(std::min(fraction, 1.0) * double(reference_bytes)));
}

size_t TierCapacity::resolve_blocks(uint64_t reference_bytes, size_t block_bytes) const {
  if (block_bytes == 0) throw std::invalid_argument("TierCapacity: block_bytes must be > 0");
  return size_t(resolve_bytes(reference_bytes) / block_bytes);
}

uint64_t host_ram_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
}

uint64_t free_disk_bytes(const std::filesystem::path& dir) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) return 0;
  return uint64_t(st.f_bavail) * uint64_t(st.f_frsize);
}

}  // namespace fdl
