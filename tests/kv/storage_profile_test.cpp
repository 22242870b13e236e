// StorageProfile: real (small) measurements, floors, JSON round trip and the cache.
#include <gtest/gtest.h>

#include <fstream>

#include "kv/storage_profile.h"
#include "tier_test_util.h"

namespace fdl::kv {
namespace {

ProfileOptions small_options(const std::filesystem::path& disk, int* recompute_calls = nullptr) {
  ProfileOptions o;
  o.block_bytes = 11520;
  o.disk_path = disk;
  o.host_bytes = 1 << 20;
  o.disk_bytes = 1 << 20;
  o.latency_samples = 5;
  o.model = "test-model";
  o.recompute_tok_per_s = [recompute_calls] {
    if (recompute_calls) ++*recompute_calls;
    return 1234.0;
  };
  o.floors = {.disk_read_latency_us_max = 1e9,
              .disk_bandwidth_gbps_min = 0,
              .host_bandwidth_gbps_min = 0};
  return o;
}

TEST(StorageProfile, MeasuresRealHostAndDirectDiskNumbers) {
  const StorageProfile p = measure_storage_profile(small_options(test::fresh_dir("prof")));
  EXPECT_GT(p.host_write_gbps, 0);
  EXPECT_GT(p.host_read_gbps, 0);
  EXPECT_GT(p.host_block_latency_us, 0);
  ASSERT_TRUE(p.disk_measured) << p.disk_note;
  EXPECT_TRUE(p.disk_direct_io);
  EXPECT_GT(p.disk_write_gbps, 0);
  EXPECT_GT(p.disk_read_gbps, 0);
  EXPECT_GT(p.disk_read_4k_latency_us, 0);
  EXPECT_GT(p.disk_read_block_latency_us, 0);
  EXPECT_TRUE(p.recompute_measured);
  EXPECT_EQ(p.recompute_tok_per_s, 1234.0);
  EXPECT_TRUE(p.host_enabled);
  EXPECT_TRUE(p.disk_enabled);
  EXPECT_FALSE(p.measured_at.empty());
  EXPECT_GT(p.measured_unix, 1700000000);
}

TEST(StorageProfile, SaysSoWhenItFallsBackToBufferedIo) {
  ProfileOptions o = small_options(test::fresh_dir("prof-fb"));
  o.refuse_direct_for_test = true;
  const StorageProfile p = measure_storage_profile(o);
  ASSERT_TRUE(p.disk_measured);
  EXPECT_FALSE(p.disk_direct_io);
  EXPECT_NE(p.disk_note.find("buffered"), std::string::npos);
}

TEST(StorageProfile, UnusableDiskIsRecordedNotThrown) {
  ProfileOptions o = small_options("/nonexistent/flashdllm");
  const StorageProfile p = measure_storage_profile(o);
  EXPECT_FALSE(p.disk_measured);
  EXPECT_FALSE(p.disk_enabled);
  EXPECT_NE(p.disk_disabled_reason.find("not measured"), std::string::npos);
  EXPECT_THROW(measure_storage_profile(ProfileOptions{}), std::invalid_argument);
}

StorageProfile sample() {
  StorageProfile p;
  p.key = std::string("k");
  p.measured_unix = 1800000000;
  p.measured_at = std::string("2027-01-15T08:00:00Z");
  p.block_bytes = 4096;
  p.host_write_gbps = 9;
  p.host_read_gbps = 8;
  p.host_block_latency_us = 1.5;
  p.disk_measured = true;
  p.disk_path = std::string("/mnt/nvme");
  p.disk_direct_io = true;
  p.disk_write_gbps = 3;
  p.disk_read_gbps = 4;
  p.disk_read_4k_latency_us = 60;
  p.disk_read_block_latency_us = 70;
  p.recompute_measured = true;
  p.model = std::string("m");
  p.recompute_tok_per_s = 500;
  return p;
}

TEST(StorageProfile, FloorsDisableSlowTiersWithAReason) {
  StorageProfile p = sample();
  apply_floors(p, {});
  EXPECT_TRUE(p.host_enabled);
  EXPECT_TRUE(p.disk_enabled);
  p.disk_read_4k_latency_us = 151;
  apply_floors(p, {});
  EXPECT_FALSE(p.disk_enabled);
  EXPECT_NE(p.disk_disabled_reason.find("latency"), std::string::npos);
  p.disk_read_4k_latency_us = 60;
  p.disk_read_gbps = 1.9;
  apply_floors(p, {});
  EXPECT_FALSE(p.disk_enabled);
  EXPECT_NE(p.disk_disabled_reason.find("bandwidth"), std::string::npos);
  p.host_read_gbps = 0.5;
  apply_floors(p, {});
  EXPECT_FALSE(p.host_enabled);
  EXPECT_FALSE(p.placement_inputs(1, 16).host.available);
}

TEST(StorageProfile, JsonRoundTripKeepsEveryField) {
  StorageProfile p = sample();
  apply_floors(p, {});
  const StorageProfile q = StorageProfile::from_json(nlohmann::json::parse(p.to_json().dump()));
  EXPECT_EQ(q.to_json(), p.to_json());
  EXPECT_EQ(q.disk_read_4k_latency_us, 60);
  auto j = p.to_json();
  j["version"] = 99;
  EXPECT_THROW(StorageProfile::from_json(j), std::invalid_argument);
  j = p.to_json();
  j["disk"].erase("read_gbps");
  EXPECT_THROW(StorageProfile::from_json(j), std::invalid_argument);
  j = p.to_json();
  j["host"]["write_gbps"] = "fast";
  EXPECT_THROW(StorageProfile::from_json(j), std::invalid_argument);
  j = p.to_json();
  j["recompute"]["tokens_per_s"] = -1;
  EXPECT_THROW(StorageProfile::from_json(j), std::invalid_argument);
}

TEST(StorageProfile, PlacementInputsUseSecondsAndBytesPerSecond) {
  StorageProfile p = sample();
  apply_floors(p, {});
  const PlacementInputs in = p.placement_inputs(0.75, 16);
  EXPECT_DOUBLE_EQ(in.host.write_bytes_per_s, 9e9);
  EXPECT_DOUBLE_EQ(in.disk.read_bytes_per_s, 4e9);
  // disk fixed latency = 70 us - 4096 B / 4e9 B/s = 68.976 us
  EXPECT_NEAR(in.disk.read_latency_s, 70e-6 - 4096 / 4e9, 1e-12);
  EXPECT_EQ(in.recompute_tok_per_s, 500);
  EXPECT_EQ(in.tier0_pressure, 0.75);
  EXPECT_TRUE(in.disk.available);
}

TEST(StorageProfile, CacheIsUsedUntilRefreshAndIgnoredWhenBroken) {
  const auto cache = test::fresh_dir("prof-cache");
  int calls = 0;
  const ProfileOptions o = small_options(test::fresh_dir("prof-cache-disk"), &calls);
  const StorageProfile a = load_or_measure_profile(o, cache, false);
  EXPECT_FALSE(a.from_cache);
  EXPECT_EQ(calls, 1);
  const auto file = profile_cache_file(cache, profile_cache_key(o));
  ASSERT_TRUE(std::filesystem::exists(file));
  const StorageProfile b = load_or_measure_profile(o, cache, false);
  EXPECT_TRUE(b.from_cache);
  EXPECT_EQ(calls, 1) << "cached: nothing re-measured";
  EXPECT_EQ(b.measured_at, a.measured_at);
  EXPECT_EQ(b.disk_read_gbps, a.disk_read_gbps);
  const StorageProfile c = load_or_measure_profile(o, cache, true);  // the override flag
  EXPECT_FALSE(c.from_cache);
  EXPECT_EQ(calls, 2);
  // Floors are re-applied to a cached profile.
  ProfileOptions strict = o;
  strict.floors.disk_bandwidth_gbps_min = 1e9;
  EXPECT_FALSE(load_or_measure_profile(strict, cache, false).disk_enabled);
  EXPECT_EQ(calls, 2);
  // A corrupt file is ignored and replaced.
  { std::ofstream(file) << "{ not json"; }
  EXPECT_FALSE(load_or_measure_profile(o, cache, false).from_cache);
  EXPECT_EQ(calls, 3);
  // Another key (other model) is another entry; a file for another key is not used.
  ProfileOptions other = o;
  other.model = "other-model";
  EXPECT_NE(profile_cache_key(other), profile_cache_key(o));
  EXPECT_FALSE(load_cached_profile(file, profile_cache_key(other)).has_value());
}

}  // namespace
}  // namespace fdl::kv
