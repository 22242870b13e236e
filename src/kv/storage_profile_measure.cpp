// measure_storage_profile: the start-up measurements behind StorageProfile (see
// storage_profile.h for what is measured and why it is measured that way).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <random>
#include <stdexcept>
#include <vector>

#include "kv/aligned_buffer.h"
#include "kv/disk_store.h"
#include "kv/storage_profile.h"

namespace fdl::kv {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + ptrdiff_t(v.size() / 2), v.end());
  return v[v.size() / 2];
}

std::string utc_now_iso(int64_t* unix_out) {
  const std::time_t t = std::time(nullptr);
  *unix_out = int64_t(t);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Block-sized memcpy between two DRAM buffers; each pass walks the whole buffer so the
// copies stream from memory, not cache. Two passes per direction, the faster one counts
// (the first also takes page faults the engine's warm arena would not).
void measure_host(const ProfileOptions& opt, StorageProfile& p) {
  const size_t bb = size_t(opt.block_bytes);
  const size_t n_blocks = std::max<size_t>(2, size_t(opt.host_bytes) / bb);
  AlignedBuffer tier0(n_blocks * bb), tier1(n_blocks * bb);
  std::memset(tier0.data(), 0x5a, tier0.size());
  auto pass = [&](uint8_t* dst, const uint8_t* src) {
    const auto t0 = Clock::now();
    for (size_t i = 0; i < n_blocks; ++i) std::memcpy(dst + i * bb, src + i * bb, bb);
    return double(n_blocks * bb) / seconds_since(t0) / 1e9;
  };
  double w = 0, r = 0;
  for (int k = 0; k < 2; ++k) {
    w = std::max(w, pass(tier1.data(), tier0.data()));
    r = std::max(r, pass(tier0.data(), tier1.data()));
  }
  p.host_write_gbps = w;
  p.host_read_gbps = r;
  // One-block latency: random blocks, so the source is (mostly) not in cache.
  std::mt19937_64 rng(42);
  std::vector<double> lat;
  const int samples = std::max(1, opt.latency_samples);
  for (int s = 0; s < samples; ++s) {
    const size_t i = size_t(rng() % n_blocks);
    const auto t0 = Clock::now();
    std::memcpy(tier0.data() + i * bb, tier1.data() + i * bb, bb);
    lat.push_back(seconds_since(t0) * 1e6);
  }
  p.host_block_latency_us = median(lat);
}

void check_all_ok(const std::vector<DiskCompletion>& done) {
  for (const auto& c : done)
    if (!c.ok())
      throw DiskStoreError(std::string("profile I/O failed: ") +
                           (c.short_io ? "short transfer" : std::strerror(c.error)));
}

// Writes every slot (sequentially, up to queue depth in flight); returns GB/s.
double write_all(DiskStore& d, const AlignedBuffer& buf) {
  std::vector<DiskCompletion> done;
  const auto t0 = Clock::now();
  for (size_t i = 0; i < d.capacity(); ++i) {
    const auto slot = d.allocate();
    d.submit_write(*slot, buf.data(), i);
    d.poll(done);
  }
  d.wait(done, d.capacity());
  const double s = seconds_since(t0);
  check_all_ok(done);
  return double(d.capacity() * d.slot_bytes()) / s / 1e9;
}

double read_all(DiskStore& d, AlignedBuffer& buf) {
  std::vector<DiskCompletion> done;
  const auto t0 = Clock::now();
  for (uint32_t i = 0; i < d.capacity(); ++i) {
    d.submit_read(i, buf.data(), i);  // one shared target: only the transfer is timed
    d.poll(done);
  }
  d.wait(done, d.capacity());
  const double s = seconds_since(t0);
  check_all_ok(done);
  return double(d.capacity() * d.slot_bytes()) / s / 1e9;
}

// Median queue-depth-1 latency of random whole-slot reads (us).
double read_latency_us(DiskStore& d, AlignedBuffer& buf, int samples) {
  std::mt19937_64 rng(7);
  std::vector<double> lat;
  std::vector<DiskCompletion> done;
  for (int s = 0; s < samples; ++s) {
    const auto slot = uint32_t(rng() % d.capacity());
    done.clear();
    const auto t0 = Clock::now();
    d.submit_read(slot, buf.data(), uint64_t(s));
    d.wait(done, 1);
    lat.push_back(seconds_since(t0) * 1e6);
    check_all_ok(done);
  }
  return median(lat);
}

void measure_disk(const ProfileOptions& opt, StorageProfile& p) {
  p.disk_path = opt.disk_path.string();
  try {
    constexpr size_t kChunk = 1u << 20;
    {
      DiskStore seq({opt.disk_path, kChunk, std::max<size_t>(1, size_t(opt.disk_bytes) / kChunk),
                     1, 8, opt.refuse_direct_for_test});
      p.disk_direct_io = seq.direct_io();
      p.disk_note = seq.direct_io_note();
      AlignedBuffer buf(kChunk);
      std::memset(buf.data(), 0xa5, buf.size());
      p.disk_write_gbps = write_all(seq, buf);
      p.disk_read_gbps = read_all(seq, buf);
    }
    const int samples = std::max(1, opt.latency_samples);
    {
      DiskStore small({opt.disk_path, kIoAlign, 4096, 1, 32, opt.refuse_direct_for_test});
      AlignedBuffer buf(kIoAlign);
      write_all(small, buf);
      p.disk_read_4k_latency_us = read_latency_us(small, buf, samples);
    }
    {
      const size_t bb = size_t(opt.block_bytes);
      const size_t n = std::clamp<size_t>((64u << 20) / round_up_io(bb), 16, 4096);
      DiskStore blocks({opt.disk_path, bb, n, 1, 32, opt.refuse_direct_for_test});
      AlignedBuffer buf(bb);
      write_all(blocks, buf);
      p.disk_read_block_latency_us = read_latency_us(blocks, buf, std::min(samples, 100));
    }
    p.disk_measured = true;
  } catch (const std::exception& e) {
    p.disk_measured = false;
    p.disk_note = e.what();
    spdlog::warn("kv storage profile: cannot measure disk '{}': {}", p.disk_path, e.what());
  }
}

}  // namespace

StorageProfile measure_storage_profile(const ProfileOptions& opt) {
  if (opt.block_bytes == 0)
    throw std::invalid_argument("measure_storage_profile: block_bytes must be > 0");
  if (opt.host_bytes < 2 * opt.block_bytes)
    throw std::invalid_argument("measure_storage_profile: host_bytes must hold >= 2 blocks");
  if (opt.disk_bytes < (1u << 20))
    throw std::invalid_argument("measure_storage_profile: disk_bytes must be >= 1 MiB");
  StorageProfile p;
  p.key = profile_cache_key(opt);
  p.measured_at = utc_now_iso(&p.measured_unix);
  p.block_bytes = opt.block_bytes;
  p.model = opt.model;
  measure_host(opt, p);
  if (!opt.disk_path.empty()) measure_disk(opt, p);
  if (opt.recompute_tok_per_s) {
    const double tps = opt.recompute_tok_per_s();
    if (std::isfinite(tps) && tps > 0) {
      p.recompute_measured = true;
      p.recompute_tok_per_s = tps;
    }
  }
  apply_floors(p, opt.floors);
  return p;
}

}  // namespace fdl::kv
