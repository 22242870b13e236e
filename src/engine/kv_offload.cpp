// KV tier placement and transfers for the scheduler (see kv_offload.h).
#include "engine/kv_offload.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "engine/step_trace.h"

namespace fdl {

const char* to_string(KvPlacementMode m) {
  switch (m) {
    case KvPlacementMode::Auto: return "auto";
    case KvPlacementMode::Recompute: return "recompute";
    case KvPlacementMode::Host: return "host";
    case KvPlacementMode::Disk: return "disk";
  }
  return "?";
}

KvPlacementMode parse_kv_placement(std::string_view text) {
  if (text == "auto") return KvPlacementMode::Auto;
  if (text == "recompute") return KvPlacementMode::Recompute;
  if (text == "host") return KvPlacementMode::Host;
  if (text == "disk") return KvPlacementMode::Disk;
  throw std::invalid_argument("--kv-placement '" + std::string(text) +
                              "' is invalid (expected auto, recompute, host or disk)");
}

}  // namespace fdl

namespace fdl::engine {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Weight of a new prefill sample in the recompute-speed average: smooths noisy steps on a
// shared machine while following a real change (longer contexts prefill slower) in ~10 steps.
constexpr double kEmaWeight = 0.2;

StepTrace::Track track_of(BlockTier a, BlockTier b) {
  return a == BlockTier::Disk || b == BlockTier::Disk ? StepTrace::Track::Disk
                                                      : StepTrace::Track::Copy;
}

double ema(double old_value, double sample) {
  return old_value > 0 ? (1 - kEmaWeight) * old_value + kEmaWeight * sample : sample;
}

const char* tier_name(BlockTier t) {
  switch (t) {
    case BlockTier::Device: return "t0";
    case BlockTier::Host: return "t1";
    case BlockTier::Disk: return "t2";
  }
  return "?";
}

}  // namespace

KvOffload::KvOffload(TierManager& tiers, const KvTierOptions& options,
                     std::optional<kv::StorageProfile> profile, int block_size,
                     size_t block_bytes)
    : tiers_(tiers), mode_(options.placement), profile_(std::move(profile)),
      block_size_(block_size), block_bytes_(block_bytes),
      half_life_(options.reuse_half_life_steps) {
  if (!(half_life_ > 0) || !std::isfinite(half_life_))
    throw std::invalid_argument("kv tiers: reuse_half_life_steps must be > 0, got " +
                                std::to_string(half_life_));
  m_.enabled = true;
  m_.placement = to_string(mode_);
  if (profile_) m_.profile = profile_->to_json().dump();
}

bool KvOffload::tier_on(BlockTier t) const { return tiers_.tier_enabled(t); }

size_t KvOffload::free_blocks(BlockTier t) const {
  return tier_on(t) ? tiers_.free_blocks(t) : 0;
}

double KvOffload::recompute_tok_per_s() const {
  if (measured_tok_per_s_ > 0) return measured_tok_per_s_;
  if (profile_ && profile_->recompute_measured) return profile_->recompute_tok_per_s;
  return 0;
}

void KvOffload::observe_prefill(size_t tokens, double seconds) {
  if (tokens == 0 || !(seconds > 0)) return;
  const double rate = double(tokens) / seconds;
  measured_tok_per_s_ = ema(measured_tok_per_s_, rate);
}

kv::PlacementInputs KvOffload::inputs() const {
  kv::PlacementInputs in = profile_->placement_inputs(1.0, block_size_);
  in.block_bytes = block_bytes_;
  in.recompute_tok_per_s = recompute_tok_per_s();
  // The profile measures the device (large transfers, queue depth 8); what a block costs the
  // engine here also includes waiting for it at queue depth ~1. Once measured, the slower of
  // the two is used, so a disk that looks fast on paper but stalls steps loses to the others.
  const double b = double(block_bytes_);
  if (disk_write_s_ > 0 && in.disk.write_bytes_per_s > 0)
    in.disk.write_bytes_per_s = std::min(in.disk.write_bytes_per_s, b / disk_write_s_);
  if (disk_read_s_ > 0 && in.disk.read_bytes_per_s > 0)
    in.disk.read_latency_s = std::max(in.disk.read_latency_s, disk_read_s_ - b / in.disk.read_bytes_per_s);
  // Device copies (GPU): tier 1 is page-locked and blocks move by DMA off the engine thread,
  // so what a host block costs is its bytes at the copy rate measured live (checksums
  // included), or at the link speed measured at start-up before the first copies; the
  // profile's memcpy figures describe another path.
  if (tiers_.copies_async()) {
    const TierManager::CopyRates c = tiers_.copy_rates();
    const double w = c.d2h_bytes_per_s, r = c.h2d_bytes_per_s;
    if (w > 0 && r > 0) {
      in.host.write_bytes_per_s = w;
      in.host.read_bytes_per_s = r;
      in.host.read_latency_s = 0;
      in.host.available = true;
    }
  }
  // What the tier manager says now beats what the profile said at start-up.
  in.host.available = in.host.available && tier_on(BlockTier::Host);
  in.disk.available = in.disk.available && tier_on(BlockTier::Disk);
  return in;
}

kv::Placement KvOffload::choose_from_device(double p) const {
  const bool host = tier_on(BlockTier::Host), disk = tier_on(BlockTier::Disk);
  switch (mode_) {
    case KvPlacementMode::Recompute: return kv::Placement::Drop;
    case KvPlacementMode::Host: return host ? kv::Placement::DemoteHost : kv::Placement::Drop;
    case KvPlacementMode::Disk:
      return host ? kv::Placement::DemoteHost
                  : disk ? kv::Placement::DemoteDisk : kv::Placement::Drop;
    case KvPlacementMode::Auto: break;
  }
  if (!profile_)
    return host ? kv::Placement::DemoteHost
                : disk ? kv::Placement::DemoteDisk : kv::Placement::Drop;
  kv::BlockCandidate c;
  c.n_tokens = uint32_t(block_size_);
  c.reuse_probability = std::clamp(p, 0.0, 1.0);
  const kv::PlacementDecision d = kv::decide_placement(inputs(), c);
  // The block must leave tier 0, so Keep is not an option: the cheapest of the rest.
  kv::Placement best = kv::Placement::Drop;
  double cost = d.cost_drop;
  if (d.cost_disk <= cost && d.cost_disk < kInf) best = kv::Placement::DemoteDisk, cost = d.cost_disk;
  if (d.cost_host <= cost && d.cost_host < kInf) best = kv::Placement::DemoteHost;
  return best;
}

kv::Placement KvOffload::choose_from_host(double p) const {
  if (!tier_on(BlockTier::Disk)) return kv::Placement::Drop;
  switch (mode_) {
    case KvPlacementMode::Recompute:
    case KvPlacementMode::Host: return kv::Placement::Drop;
    case KvPlacementMode::Disk: return kv::Placement::DemoteDisk;
    case KvPlacementMode::Auto: break;
  }
  if (!profile_) return kv::Placement::DemoteDisk;
  const kv::PlacementInputs in = inputs();
  if (!in.disk.available || in.disk.write_bytes_per_s <= 0 || in.disk.read_bytes_per_s <= 0)
    return kv::Placement::Drop;
  const double b = double(block_bytes_);
  p = std::clamp(p, 0.0, 1.0);
  // The host slot is already aligned: the write is tier 1 -> 2 only.
  const double c_disk = b / in.disk.write_bytes_per_s +
                        p * (b / in.disk.read_bytes_per_s + in.disk.read_latency_s);
  const double r = in.recompute_tok_per_s;
  const double c_drop = p == 0 ? 0 : r > 0 ? p * double(block_size_) / r : kInf;
  return c_disk <= c_drop ? kv::Placement::DemoteDisk : kv::Placement::Drop;
}

void KvOffload::record_events(const std::vector<TierEvent>& events,
                              std::vector<OffloadId>* failed) {
  for (const TierEvent& e : events) {
    const bool demote = e.kind == TierEvent::Kind::Demote;
    if (demote && e.status == TransferStatus::IoError && e.from == BlockTier::Device &&
        failed != nullptr)
      failed->push_back(e.id);
    if (trace_ != nullptr)
      trace_->span_ending_now(track_of(e.from, e.to),
                              std::string(demote ? "demote " : "promote ") + tier_name(e.from) +
                                  "->" + tier_name(e.to),
                              e.latency_us,
                              {{"bytes", block_bytes_}, {"id", e.id}, {"status", to_string(e.status)}});
  }
}

TierEvent KvOffload::demote(BlockId block, BlockTier to) {
  const auto t0 = std::chrono::steady_clock::now();
  const TierEvent ev = tiers_.demote(block, to);
  if (ev.status == TransferStatus::Ok || ev.status == TransferStatus::Pending) {
    ++(to == BlockTier::Host ? m_.demoted_host : m_.demoted_disk);
    if (to == BlockTier::Disk) ++unsettled_disk_writes_;
    // Synchronous host copies are traced now; disk writes and device copies on completion.
    if (trace_ != nullptr && to == BlockTier::Host && !tiers_.copies_async())
      trace_->span(StepTrace::Track::Copy, "demote t0->t1", t0, ev.latency_us,
                   {{"bytes", block_bytes_}, {"id", ev.id}});
  }
  return ev;
}

TierEvent KvOffload::demote_to_disk(OffloadId id) {
  const TierEvent ev = tiers_.demote_to_disk(id);
  if (ev.status == TransferStatus::Pending) {
    ++m_.demoted_disk;
    ++unsettled_disk_writes_;
  }
  return ev;
}

TierEvent KvOffload::bring_back(OffloadId id, size_t n_tokens) {
  const auto t0 = std::chrono::steady_clock::now();
  const BlockTier from = tiers_.meta(id).tier;
  const bool landed = tiers_.copies_async() && tiers_.ready(id) && tiers_.meta(id).tier == BlockTier::Device;
  const TierEvent ev = tiers_.wait_resident(id);
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  if (tiers_.copies_async() && !landed) count_wait(us);  // a landed prefetch is claimed, not waited for
  if (ev.status == TransferStatus::Ok) {
    ++m_.promoted;
    if (from == BlockTier::Disk) disk_read_s_ = ema(disk_read_s_, us * 1e-6);
  } else if (ev.status != TransferStatus::NoSpace) {
    ++m_.failed_promotions;
    m_.lost_tokens += int64_t(n_tokens);
    spdlog::warn("kv tiers: offload id {} came back {}; its {} tokens are recomputed", id,
                 to_string(ev.status), n_tokens);
  }
  if (trace_ != nullptr && ev.status != TransferStatus::NoSpace)
    trace_->span(track_of(from, BlockTier::Device),
                 std::string("wait ") + tier_name(from) + "->t0", t0, us,
                 {{"bytes", block_bytes_}, {"id", id}, {"status", to_string(ev.status)}});
  return ev;
}

bool KvOffload::prefetch(OffloadId id) {
  const OffloadId ids[1] = {id};
  const auto ev = tiers_.prefetch(ids);
  const bool started = !ev.empty() && (ev[0].status == TransferStatus::Pending ||
                                       ev[0].status == TransferStatus::Ok);
  if (started) ++m_.prefetches;
  return started;
}

void KvOffload::discard(OffloadId id, bool counts_as_drop) {
  tiers_.discard(id);
  if (counts_as_drop) ++m_.dropped;
}

void KvOffload::count_wait(double us) {
  m_.copy_waits += 1;
  m_.copy_wait_ms_total += us * 1e-3;
  m_.copy_wait_ms_max = std::max(m_.copy_wait_ms_max, us * 1e-3);
}

bool KvOffload::ready(OffloadId id) { return tiers_.ready(id); }

void KvOffload::flush() { tiers_.flush(); }

std::vector<OffloadId> KvOffload::settle() {
  const auto t0 = std::chrono::steady_clock::now();
  tiers_.drain_disk();  // device copies to and from tier 1 go on
  if (unsettled_disk_writes_ > 0) {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    disk_write_s_ = ema(disk_write_s_, s / double(unsettled_disk_writes_));
    unsettled_disk_writes_ = 0;
  }
  std::vector<OffloadId> failed;
  record_events(tiers_.poll(), &failed);
  return failed;
}

void KvOffload::poll() { record_events(tiers_.poll(), nullptr); }

KvTierMetrics KvOffload::metrics() const {
  KvTierMetrics m = m_;
  m.tiers = tiers_.stats();
  m.recompute_tok_per_s = recompute_tok_per_s();
  m.disk_write_ms_per_block = disk_write_s_ * 1e3;
  m.disk_read_ms_per_block = disk_read_s_ * 1e3;
  return m;
}

}  // namespace fdl::engine
