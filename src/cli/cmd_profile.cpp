// `flashdllm profile` — measure (or show the cached) storage profile that drives KV block
// placement: tier 0 <-> tier 1 copy speed, tier 1 <-> tier 2 direct-I/O disk speed on
// --kv-disk-path, and the model's prefill (recompute) speed. See docs/KV_TIERS.md.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/cli_error.h"
#include "cli/commands.h"
#include "cli/json_output.h"
#include "cli/model_path.h"
#include "cli/option_checks.h"
#include "engine/prefill_speed.h"
#include "flashdllm/kv_cache.h"
#include "flashdllm/model.h"
#include "kv/storage_profile.h"

namespace fdl::cli {
namespace {

struct ProfileCliOptions {
  std::string model;
  std::string disk_path;
  std::string cache_dir;
  bool json = false;
  bool refresh = false;
  int block_size = 16;
  int threads = 0;
  int prefill_tokens = 128;
  long long host_mib = 128;
  long long disk_mib = 256;
  double max_disk_latency_us = 150.0;
  double min_disk_gbps = 2.0;
  double min_host_gbps = 1.0;
};


void print_plain(const kv::StorageProfile& p) {
  std::printf("storage profile (%s, measured %s)\n", p.from_cache ? "cached" : "fresh",
              p.measured_at.c_str());
  std::printf("block:      %llu bytes\n", static_cast<unsigned long long>(p.block_bytes));
  std::printf("tier0<->1:  write %.2f GB/s, read %.2f GB/s, one block %.1f us  [%s]\n",
              p.host_write_gbps, p.host_read_gbps, p.host_block_latency_us,
              p.host_enabled ? "enabled" : ("disabled: " + p.host_disabled_reason).c_str());
  if (p.disk_measured) {
    std::printf("tier1<->2:  %s (%s)\n", p.disk_path.c_str(),
                p.disk_direct_io ? "O_DIRECT" : p.disk_note.c_str());
    std::printf("            write %.2f GB/s, read %.2f GB/s, 4 KiB read %.1f us, "
                "one block read %.1f us  [%s]\n",
                p.disk_write_gbps, p.disk_read_gbps, p.disk_read_4k_latency_us,
                p.disk_read_block_latency_us,
                p.disk_enabled ? "enabled" : ("disabled: " + p.disk_disabled_reason).c_str());
  } else {
    std::printf("tier1<->2:  disabled: %s\n", p.disk_disabled_reason.c_str());
  }
  if (p.recompute_measured)
    std::printf("recompute:  %.0f prefill tokens/s (%s)\n", p.recompute_tok_per_s, p.model.c_str());
  else
    std::printf("recompute:  not measured\n");
}

void run_profile(const ProfileCliOptions& o) {
  check_int_in("--block-size", o.block_size, 1, kMaxBlockSize);
  check_int_in("-t/--threads", o.threads, 0, kMaxThreads);
  check_int_in("--prefill-tokens", o.prefill_tokens, 1, 1 << 16);
  check_int_in("--host-mib", o.host_mib, 1, 1 << 20);
  check_int_in("--disk-mib", o.disk_mib, 1, 1 << 22);
  check_finite_in("--max-disk-latency-us", o.max_disk_latency_us, 0, 1e9);
  check_finite_in("--min-disk-gbps", o.min_disk_gbps, 0, 1e6);
  check_finite_in("--min-host-gbps", o.min_host_gbps, 0, 1e6);
  if (!o.disk_path.empty() && !std::filesystem::is_directory(o.disk_path))
    throw CliError("--kv-disk-path '" + o.disk_path + "' is not a directory");

  const auto path = resolve_model_path(o.model);
  const auto model = Model::load(path, ModelOptions{.n_threads = o.threads});
  kv::ProfileOptions opt;
  opt.block_bytes = model->kv_shape(o.block_size).block_bytes();
  opt.disk_path = o.disk_path;
  opt.host_bytes = std::max<uint64_t>(uint64_t(o.host_mib) << 20, 2 * opt.block_bytes);
  opt.disk_bytes = uint64_t(o.disk_mib) << 20;
  // Part of the cache key: the same file name with other contents is another model.
  opt.model = path.filename().string() + ",bytes=" + std::to_string(model->gguf().file_size()) +
              ",threads=" + std::to_string(model->n_threads());
  opt.recompute_tok_per_s = [&] {
    return engine::measure_prefill_tok_per_s(*model, o.block_size, o.prefill_tokens);
  };
  opt.floors = {o.max_disk_latency_us, o.min_disk_gbps, o.min_host_gbps};
  const auto dir = o.cache_dir.empty() ? kv::default_profile_cache_dir()
                                       : std::filesystem::path(o.cache_dir);
  const kv::StorageProfile p = kv::load_or_measure_profile(opt, dir, o.refresh);
  if (o.json) {
    nlohmann::json j = p.to_json();
    j["from_cache"] = p.from_cache;
    j["cache_file"] = kv::profile_cache_file(dir, p.key).string();
    print_json_line(j);
  } else {
    print_plain(p);
  }
}

}  // namespace

void add_profile_command(CLI::App& app) {
  auto opt = std::make_shared<ProfileCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "profile", "Measure (or show the cached) storage profile used for KV tier placement");
  cmd->add_option("-m,--model", opt->model,
                  "GGUF file or Hugging Face model directory (default: $FLASHDLLM_MODEL or stories260K)");
  cmd->add_option("--kv-disk-path", opt->disk_path, "Directory of the disk KV tier to measure");
  cmd->add_flag("--json", opt->json, "Print one JSON object");
  cmd->add_flag("--refresh", opt->refresh, "Measure again even if a cached profile exists");
  cmd->add_option("--cache-dir", opt->cache_dir,
                  "Profile cache directory (default: $XDG_CACHE_HOME/flashdllm, else "
                  "~/.cache/flashdllm)");
  cmd->add_option("--block-size", opt->block_size, "Tokens per KV block")->capture_default_str();
  cmd->add_option("-t,--threads", opt->threads, "Worker threads (0 = all cores)")
      ->capture_default_str();
  cmd->add_option("--prefill-tokens", opt->prefill_tokens,
                  "Prompt length for the recompute measurement")
      ->capture_default_str();
  cmd->add_option("--host-mib", opt->host_mib, "Buffer size for the host copy measurement (MiB)")
      ->capture_default_str();
  cmd->add_option("--disk-mib", opt->disk_mib,
                  "File size for the sequential disk measurement (MiB)")
      ->capture_default_str();
  cmd->add_option("--max-disk-latency-us", opt->max_disk_latency_us,
                  "Floor: disable the disk tier above this 4 KiB read latency (us)")
      ->capture_default_str();
  cmd->add_option("--min-disk-gbps", opt->min_disk_gbps,
                  "Floor: disable the disk tier below this read bandwidth (GB/s)")
      ->capture_default_str();
  cmd->add_option("--min-host-gbps", opt->min_host_gbps,
                  "Floor: disable the host tier below this copy bandwidth (GB/s)")
      ->capture_default_str();
  cmd->callback([opt] { run_profile(*opt); });
}

}  // namespace fdl::cli
