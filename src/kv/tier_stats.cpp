// Tier metrics: the latency histogram, status names and the JSON form of TierStats.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "flashdllm/kv_tiers.h"

namespace fdl {

const char* to_string(TransferStatus s) {
  switch (s) {
    case TransferStatus::Ok: return "ok";
    case TransferStatus::Pending: return "pending";
    case TransferStatus::NoSpace: return "no_space";
    case TransferStatus::TierDisabled: return "tier_disabled";
    case TransferStatus::Paused: return "paused";
    case TransferStatus::IoError: return "io_error";
    case TransferStatus::Corrupt: return "corrupt";
    case TransferStatus::Lost: return "lost";
  }
  return "?";
}

void LatencyHistogram::record(double us) {
  if (!std::isfinite(us) || us < 0) return;
  int b = us < 1.0 ? 0 : int(std::floor(std::log2(us)));
  if (b >= kBuckets) b = kBuckets - 1;
  ++buckets[size_t(b)];
  ++count;
  sum_us += us;
  if (us > max_us) max_us = us;
}

double LatencyHistogram::quantile_us(double q) const {
  if (count == 0) return 0.0;
  q = std::clamp(q, 0.0, 1.0);
  const auto rank = uint64_t(std::ceil(q * double(count)));
  uint64_t seen = 0;
  for (int b = 0; b < kBuckets; ++b) {
    seen += buckets[size_t(b)];
    if (seen >= std::max<uint64_t>(rank, 1)) return std::min(std::ldexp(1.0, b + 1), max_us);
  }
  return max_us;
}

namespace {

nlohmann::json hist_json(const LatencyHistogram& h) {
  return {{"count", h.count},          {"mean_us", h.mean_us()},
          {"p50_us", h.quantile_us(0.5)}, {"p95_us", h.quantile_us(0.95)},
          {"max_us", h.max_us},        {"log2_buckets_us", h.buckets}};
}

}  // namespace

std::string TierStats::to_json() const {
  static const char* names[] = {"device", "host", "disk"};
  nlohmann::json j;
  for (size_t t = 0; t < 3; ++t) {
    const TierCounters& c = tier[t];
    j["tiers"][names[t]] = {{"capacity_blocks", c.capacity_blocks},
                            {"used_blocks", c.used_blocks},
                            {"enabled", c.enabled},
                            {"disabled_reason", c.disabled_reason},
                            {"checksum_failures", c.checksum_failures},
                            {"io_errors", c.io_errors},
                            {"write_latency", hist_json(c.write_latency)},
                            {"read_latency", hist_json(c.read_latency)}};
  }
  for (size_t f = 0; f < 3; ++f)
    for (size_t t = 0; t < 3; ++t)
      if (blocks_moved[f][t] > 0)
        j["moved"][std::string(names[f]) + "_to_" + names[t]] = {{"blocks", blocks_moved[f][t]},
                                                                  {"bytes", bytes_moved[f][t]}};
  j["prefetch"] = {{"hits", prefetch_hits}, {"late", prefetch_late}, {"misses", prefetch_misses}};
  j["disk_direct_io"] = disk_direct_io;
  j["disk_io_note"] = disk_io_note;
  j["breaker"] = {{"open", breaker_open},       {"manual", breaker_manual},
                  {"trips", breaker_trips},     {"p95_ms", breaker_p95_ms},
                  {"reason", breaker_reason}};
  j["offloaded_blocks"] = offloaded_blocks;
  if (async_copies) {
    auto gbps = [](uint64_t bytes, double ms) { return ms > 0 ? double(bytes) / (ms * 1e6) : 0.0; };
    j["device_copies"] = {{"link_gbps", {{"h2d", link_h2d_gbps}, {"d2h", link_d2h_gbps}}},
                          {"bytes", {{"h2d", copy_h2d_bytes}, {"d2h", copy_d2h_bytes}}},
                          {"device_ms", {{"h2d", copy_h2d_ms}, {"d2h", copy_d2h_ms}}},
                          {"gbps", {{"h2d", gbps(copy_h2d_bytes, copy_h2d_ms)},
                                    {"d2h", gbps(copy_d2h_bytes, copy_d2h_ms)}}}};
  }
  return j.dump();
}

}  // namespace fdl
