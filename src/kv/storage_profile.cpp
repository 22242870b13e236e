// StorageProfile: JSON form, floors and the cost-rule inputs (see storage_profile.h).
#include "kv/storage_profile.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace fdl::kv {
namespace {

template <class T>
T field(const nlohmann::json& j, const char* name) {
  if (!j.contains(name))
    throw std::invalid_argument(std::string("storage profile: missing field '") + name + "'");
  try {
    return j.at(name).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw std::invalid_argument(std::string("storage profile: field '") + name +
                                "' has the wrong type");
  }
}

constexpr double kGB = 1e9;

}  // namespace

nlohmann::json StorageProfile::to_json() const {
  return {{"version", kVersion},
          {"key", key},
          {"measured_unix", measured_unix},
          {"measured_at", measured_at},
          {"block_bytes", block_bytes},
          {"host", {{"write_gbps", host_write_gbps},
                    {"read_gbps", host_read_gbps},
                    {"block_latency_us", host_block_latency_us},
                    {"enabled", host_enabled},
                    {"disabled_reason", host_disabled_reason}}},
          {"disk", {{"measured", disk_measured},
                    {"path", disk_path},
                    {"direct_io", disk_direct_io},
                    {"note", disk_note},
                    {"write_gbps", disk_write_gbps},
                    {"read_gbps", disk_read_gbps},
                    {"read_4k_latency_us", disk_read_4k_latency_us},
                    {"read_block_latency_us", disk_read_block_latency_us},
                    {"enabled", disk_enabled},
                    {"disabled_reason", disk_disabled_reason}}},
          {"recompute", {{"measured", recompute_measured},
                         {"model", model},
                         {"tokens_per_s", recompute_tok_per_s}}}};
}

StorageProfile StorageProfile::from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw std::invalid_argument("storage profile: not a JSON object");
  if (field<int>(j, "version") != kVersion)
    throw std::invalid_argument("storage profile: version " + j.at("version").dump() +
                                " is not " + std::to_string(kVersion));
  StorageProfile p;
  p.key = field<std::string>(j, "key");
  p.measured_unix = field<int64_t>(j, "measured_unix");
  p.measured_at = field<std::string>(j, "measured_at");
  p.block_bytes = field<uint64_t>(j, "block_bytes");
  const auto h = field<nlohmann::json>(j, "host");
  p.host_write_gbps = field<double>(h, "write_gbps");
  p.host_read_gbps = field<double>(h, "read_gbps");
  p.host_block_latency_us = field<double>(h, "block_latency_us");
  p.host_enabled = field<bool>(h, "enabled");
  p.host_disabled_reason = field<std::string>(h, "disabled_reason");
  const auto d = field<nlohmann::json>(j, "disk");
  p.disk_measured = field<bool>(d, "measured");
  p.disk_path = field<std::string>(d, "path");
  p.disk_direct_io = field<bool>(d, "direct_io");
  p.disk_note = field<std::string>(d, "note");
  p.disk_write_gbps = field<double>(d, "write_gbps");
  p.disk_read_gbps = field<double>(d, "read_gbps");
  p.disk_read_4k_latency_us = field<double>(d, "read_4k_latency_us");
  p.disk_read_block_latency_us = field<double>(d, "read_block_latency_us");
  p.disk_enabled = field<bool>(d, "enabled");
  p.disk_disabled_reason = field<std::string>(d, "disabled_reason");
  const auto r = field<nlohmann::json>(j, "recompute");
  p.recompute_measured = field<bool>(r, "measured");
  p.model = field<std::string>(r, "model");
  p.recompute_tok_per_s = field<double>(r, "tokens_per_s");
  for (double v : {p.host_write_gbps, p.host_read_gbps, p.host_block_latency_us,
                   p.disk_write_gbps, p.disk_read_gbps, p.disk_read_4k_latency_us,
                   p.disk_read_block_latency_us, p.recompute_tok_per_s})
    if (!std::isfinite(v) || v < 0)
      throw std::invalid_argument("storage profile: negative or non-finite measurement");
  return p;
}

void apply_floors(StorageProfile& p, const ProfileFloors& f) {
  p.host_enabled = true;
  p.host_disabled_reason.clear();
  const double host_gbps = std::min(p.host_write_gbps, p.host_read_gbps);
  if (host_gbps < f.host_bandwidth_gbps_min) {
    p.host_enabled = false;
    p.host_disabled_reason = "host copy bandwidth " + std::to_string(host_gbps) +
                             " GB/s < floor " + std::to_string(f.host_bandwidth_gbps_min) + " GB/s";
  }
  p.disk_enabled = p.disk_measured;
  p.disk_disabled_reason.clear();
  if (!p.disk_measured) {
    p.disk_disabled_reason = p.disk_path.empty() ? "no --kv-disk-path"
                                                 : "not measured: " + p.disk_note;
  } else if (p.disk_read_4k_latency_us > f.disk_read_latency_us_max) {
    p.disk_enabled = false;
    p.disk_disabled_reason = "4 KiB read latency " + std::to_string(p.disk_read_4k_latency_us) +
                             " us > floor " + std::to_string(f.disk_read_latency_us_max) + " us";
  } else if (p.disk_read_gbps < f.disk_bandwidth_gbps_min) {
    p.disk_enabled = false;
    p.disk_disabled_reason = "sequential read bandwidth " + std::to_string(p.disk_read_gbps) +
                             " GB/s < floor " + std::to_string(f.disk_bandwidth_gbps_min) + " GB/s";
  }
  if (!p.host_enabled) spdlog::warn("kv tier 1 (host) disabled: {}", p.host_disabled_reason);
  if (p.disk_measured && !p.disk_enabled)
    spdlog::warn("kv tier 2 (disk {}) disabled: {}", p.disk_path, p.disk_disabled_reason);
}

PlacementInputs StorageProfile::placement_inputs(double tier0_pressure, int block_size) const {
  PlacementInputs in;
  in.block_bytes = size_t(block_bytes);
  in.block_size = block_size;
  in.tier0_pressure = tier0_pressure;
  in.recompute_tok_per_s = recompute_measured ? recompute_tok_per_s : 0.0;
  in.host = {host_enabled, host_write_gbps * kGB, host_read_gbps * kGB,
             host_block_latency_us * 1e-6};
  // The block latency already includes its transfer; the fixed part is what exceeds
  // bytes/bandwidth, never negative.
  auto fixed_part_s = [this](double block_latency_us, double gbps) {
    if (gbps <= 0) return 0.0;
    return std::max(0.0, block_latency_us * 1e-6 - double(block_bytes) / (gbps * kGB));
  };
  in.disk = {disk_enabled, disk_write_gbps * kGB, disk_read_gbps * kGB,
             fixed_part_s(disk_read_block_latency_us, disk_read_gbps)};
  in.host.read_latency_s = fixed_part_s(host_block_latency_us, host_read_gbps);
  return in;
}

}  // namespace fdl::kv
