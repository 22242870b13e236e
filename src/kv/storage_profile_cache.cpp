// The per-device/path profile cache: one JSON file per key (see storage_profile.h).
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <system_error>

#include "kv/storage_profile.h"

namespace fdl::kv {

std::string profile_cache_key(const ProfileOptions& opt) {
  std::string disk = "none";
  if (!opt.disk_path.empty()) {
    std::error_code ec;
    const auto canon = std::filesystem::weakly_canonical(opt.disk_path, ec);
    struct stat st {};
    const bool have_dev = ::stat(opt.disk_path.c_str(), &st) == 0;
    // The device number makes a re-mounted or replaced disk at the same path a new entry.
    disk = (ec ? opt.disk_path.string() : canon.string()) + "@dev" +
           (have_dev ? std::to_string(uint64_t(st.st_dev)) : std::string("?"));
  }
  return "disk=" + disk + ";block_bytes=" + std::to_string(opt.block_bytes) +
         ";model=" + (opt.model.empty() ? "none" : opt.model);
}

std::filesystem::path default_profile_cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return std::filesystem::path(x) / "flashdllm";
  if (const char* h = std::getenv("HOME"); h && *h)
    return std::filesystem::path(h) / ".cache" / "flashdllm";
  return std::filesystem::temp_directory_path() / "flashdllm-cache";
}

std::filesystem::path profile_cache_file(const std::filesystem::path& dir, const std::string& key) {
  char name[64];
  std::snprintf(name, sizeof name, "storage-profile-%016llx.json",
                static_cast<unsigned long long>(XXH3_64bits(key.data(), key.size())));
  return dir / name;
}

std::optional<StorageProfile> load_cached_profile(const std::filesystem::path& file,
                                                  const std::string& key) {
  std::ifstream in(file);
  if (!in) return std::nullopt;
  try {
    StorageProfile p = StorageProfile::from_json(nlohmann::json::parse(in));
    if (p.key != key) {
      spdlog::warn("storage profile cache {}: for '{}', not '{}'; re-measuring", file.string(),
                   p.key, key);
      return std::nullopt;
    }
    p.from_cache = true;
    return p;
  } catch (const std::exception& e) {
    spdlog::warn("storage profile cache {} unusable ({}); re-measuring", file.string(), e.what());
    return std::nullopt;
  }
}

void save_profile(const std::filesystem::path& file, const StorageProfile& p) {
  std::error_code ec;
  std::filesystem::create_directories(file.parent_path(), ec);
  const auto tmp = file.string() + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << p.to_json().dump(2) << '\n';
    out.flush();
    if (!out) {
      std::filesystem::remove(tmp, ec);
      throw std::runtime_error("cannot write storage profile cache '" + tmp + "'");
    }
  }
  std::filesystem::rename(tmp, file, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw std::runtime_error("cannot write storage profile cache '" + file.string() + "'");
  }
}

StorageProfile load_or_measure_profile(const ProfileOptions& opt,
                                       const std::filesystem::path& cache_dir, bool refresh) {
  const std::string key = profile_cache_key(opt);
  const auto file = profile_cache_file(cache_dir, key);
  if (!refresh) {
    if (auto cached = load_cached_profile(file, key)) {
      apply_floors(*cached, opt.floors);  // floors may have changed since it was measured
      return *cached;
    }
  }
  StorageProfile p = measure_storage_profile(opt);
  try {
    save_profile(file, p);
  } catch (const std::exception& e) {
    spdlog::warn("{}; the profile is not cached", e.what());
  }
  return p;
}

}  // namespace fdl::kv
