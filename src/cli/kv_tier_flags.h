// kv_tier_flags.h — the KV tier flags shared by `generate`, `multiturn` and `serve`:
// --kv-tier0-bytes, --kv-host-bytes, --kv-disk-bytes,
// --kv-disk-path, --kv-disk-retry, --kv-placement, --kv-profile-cache. docs/KV_TIERS.md describes the tiers.
//
// Sizes: bytes with optional suffix (536870912, 512MiB, 4GiB, 2GB); host and disk also take
// a fraction ("25%", "0.25") of RAM / of the free space under --kv-disk-path. Tier 0 takes
// bytes only (the pool must hold at least one full context; the error says how many blocks).
// Errors: CliError naming the flag (bad size, disk size without a path, a path that is not a
// directory, an unknown placement).
#pragma once

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "cli/cli_error.h"
#include "flashdllm/generator.h"

namespace fdl::cli {

struct KvTierFlags {
  std::string tier0_bytes;  // "" = the default pool (max sequences x full context)
  std::string host_bytes;   // "" = no tier 1
  std::string disk_bytes;   // "" = no tier 2
  std::string disk_path;
  double disk_retry_s = TierConfig{}.disk_retry_s;
  std::string placement = "auto";
  std::string profile_cache;  // "" = $XDG_CACHE_HOME/flashdllm
};

inline void add_kv_tier_flags(CLI::App* cmd, KvTierFlags& f) {
  cmd->add_option("--kv-tier0-bytes", f.tier0_bytes,
                  "KV tier 0 (compute memory) size, e.g. 64MiB (default: every sequence's full context)");
  cmd->add_option("--kv-host-bytes", f.host_bytes, "KV tier 1 (host DRAM) size: bytes or % of RAM");
  cmd->add_option("--kv-disk-bytes", f.disk_bytes,
                  "KV tier 2 (disk) size: bytes or % of the free space under --kv-disk-path");
  cmd->add_option("--kv-disk-path", f.disk_path, "Directory for the KV tier-2 files (O_DIRECT)");
  cmd->add_option("--kv-disk-retry", f.disk_retry_s,
                  "Seconds tier 2 stays off after an I/O error before it is tried again, doubling while it "
                  "keeps failing (0: off for good)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  cmd->add_option("--kv-placement", f.placement,
                  "Where evicted KV blocks go: auto (cost rule), recompute, host, disk")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "recompute", "host", "disk"}));
  cmd->add_option("--kv-profile-cache", f.profile_cache,
                  "Storage profile cache directory (default: $XDG_CACHE_HOME/flashdllm)");
}

/// The tier layer logs (profile, disk errors, checksum failures) through spdlog, whose
/// default logger writes to stdout; stdout carries the command's output, so send logs to
/// stderr.
inline void kv_logs_to_stderr() {
  if (!spdlog::get("flashdllm-cli")) spdlog::set_default_logger(spdlog::stderr_color_mt("flashdllm-cli"));
}

inline TierCapacity parse_capacity(const char* flag, const std::string& text) {
  try {
    return TierCapacity::parse(text);
  } catch (const std::invalid_argument& e) {
    throw CliError(std::string(flag) + ": " + e.what());
  }
}

/// The tier options for GeneratorOptions::kv_tiers. Throws CliError on bad flags.
inline KvTierOptions kv_tier_options(const KvTierFlags& f) {
  KvTierOptions o;
  try {
    o.placement = parse_kv_placement(f.placement);
  } catch (const std::invalid_argument& e) {
    throw CliError(e.what());
  }
  if (!f.host_bytes.empty()) o.tiers.host = parse_capacity("--kv-host-bytes", f.host_bytes);
  if (!f.disk_bytes.empty() && f.disk_path.empty())
    throw CliError("--kv-disk-bytes needs --kv-disk-path (the directory for tier 2)");
  if (!f.disk_path.empty()) {
    if (!std::filesystem::is_directory(f.disk_path))
      throw CliError("--kv-disk-path '" + f.disk_path + "' is not a directory");
    if (f.disk_bytes.empty())
      throw CliError("--kv-disk-path needs --kv-disk-bytes (how much of it tier 2 may use)");
    o.tiers.disk = parse_capacity("--kv-disk-bytes", f.disk_bytes);
    o.tiers.disk_path = f.disk_path;
  }
  o.tiers.disk_retry_s = f.disk_retry_s;
  o.profile_cache_dir = f.profile_cache;
  // An explicit demotion target whose tier is absent (or sized 0) would silently run as
  // recompute: `host` needs tier 1; `disk` needs tier 2 (it ages blocks through tier 1 when
  // that is configured too).
  auto sized = [](const TierCapacity& c) { return c.bytes > 0 || c.fraction > 0; };
  if (o.placement == KvPlacementMode::Host && !sized(o.tiers.host))
    throw CliError("--kv-placement host needs KV tier 1: a positive --kv-host-bytes");
  if (o.placement == KvPlacementMode::Disk && (o.tiers.disk_path.empty() || !sized(o.tiers.disk)))
    throw CliError("--kv-placement disk needs KV tier 2: --kv-disk-path with a positive --kv-disk-bytes");
  return o;
}

/// How a tier-0 message names the context: the flag when given, else where it came from
/// (`fallback`, e.g. "the default context").
inline std::string ctx_description(int ctx_flag, int n_ctx, const std::string& fallback = "the default context") {
  return ctx_flag > 0 ? "--ctx-size " + std::to_string(n_ctx)
                      : fallback + " of " + std::to_string(n_ctx) + " tokens";
}

/// "2.5 MiB"-style size for messages.
inline std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) v /= 1024.0, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

/// Tier-0 blocks for --kv-tier0-bytes (0 = default). Throws CliError when it is not a plain
/// positive size, or when it cannot hold one full context of `n_ctx` tokens in blocks of
/// `block_size` (a request may always need one); `ctx_what` names that context in the
/// message, e.g. "--ctx-size 512" or "the default context of 2048 tokens".
inline size_t kv_tier0_blocks(const KvTierFlags& f, size_t block_bytes, int n_ctx, int block_size,
                              const std::string& ctx_what) {
  if (f.tier0_bytes.empty()) return 0;
  TierCapacity c;
  try {
    c = TierCapacity::parse(f.tier0_bytes);
  } catch (const std::invalid_argument&) {  // its message offers fractions, which tier 0 does not take
    throw CliError("--kv-tier0-bytes takes a size in bytes (e.g. 64MiB, 2GiB), got '" + f.tier0_bytes + "'");
  }
  if (c.bytes == 0 && c.fraction > 0)
    throw CliError("--kv-tier0-bytes takes a size in bytes (e.g. 64MiB), not a fraction");
  if (c.bytes == 0)
    throw CliError("--kv-tier0-bytes must be a positive size (leave it out for the default: room for every "
                   "sequence's full context)");
  const size_t blocks = size_t(c.bytes / block_bytes);
  if (blocks == 0)
    throw CliError("--kv-tier0-bytes " + f.tier0_bytes + " is less than one KV block (" +
                   std::to_string(block_bytes) + " bytes)");
  const size_t per_context = (size_t(std::max(n_ctx, 1)) + size_t(block_size) - 1) / size_t(std::max(block_size, 1));
  if (blocks < per_context)
    throw CliError("--kv-tier0-bytes " + f.tier0_bytes + " holds " + std::to_string(blocks) + " KV blocks; one full " +
                   "context (" + ctx_what + ") needs " + std::to_string(per_context) + " blocks of " +
                   std::to_string(block_size) + " tokens = " + human_bytes(uint64_t(per_context) * block_bytes));
  return blocks;
}

}  // namespace fdl::cli
