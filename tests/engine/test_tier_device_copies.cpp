// The scheduler over tiers whose tier-0 copies are asynchronous device copies (the CUDA
// model's path), on the CPU: a stand-in mirror over the pool's own host arena copies at once
// but reports each copy done only after it has been asked a few times, as a DMA still in
// flight would be. With tier 0 capped so that returning sessions must come back from tier 1
// (and tier 2), outputs equal an uncapped run; the prefixes of waiting requests are brought
// back ahead of their admission and claimed once landed; nothing leaks.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>

#include "device_sampling_model.h"
#include "test_tier_fixture.h"

namespace fdl {
namespace {

class LaggingCopies final : public BlockMirror {
 public:
  LaggingCopies(BlockPool& pool, int lag) : pool_(pool), lag_(lag) {}
  void pull(BlockId, std::span<uint8_t>) override { ADD_FAILURE() << "synchronous pull with device copies"; }
  void push(BlockId, std::span<const uint8_t>) override { ADD_FAILURE() << "synchronous push with device copies"; }
  bool copies_async() const override { return true; }
  std::shared_ptr<void> pin_host(void* p, size_t) override {
    ++pins;
    return std::shared_ptr<void>(p, [](void*) {});
  }
  CopyHandle queue_copy(BlockId id, uint8_t* host, bool to_host) override {
    const auto bytes = pool_.block_bytes(id);
    if (to_host)
      std::copy(bytes.begin(), bytes.end(), host);
    else
      std::copy(host, host + bytes.size(), bytes.begin());
    copies_.push_back({next_, lag_, block_checksum(bytes)});
    ++queued;
    return {next_++, 0};
  }
  bool copy_done(CopyHandle h) override {
    Copy& c = find(h.group);
    if (c.polls_left > 0) --c.polls_left;
    return c.polls_left == 0;
  }
  void wait_copy(CopyHandle h) override {
    ++waits;
    find(h.group).polls_left = 0;
    // Copies complete in queue order: the earlier ones are done too.
    for (Copy& c : copies_)
      if (c.seq <= h.group) c.polls_left = 0;
  }
  uint64_t collect_copy(CopyHandle h) override {
    const uint64_t sum = find(h.group).sum;
    std::erase_if(copies_, [&](const Copy& c) { return c.seq == h.group; });
    return sum;
  }
  int pins = 0, waits = 0, queued = 0;

 private:
  struct Copy {
    uint64_t seq;
    int polls_left;
    uint64_t sum;
  };
  Copy& find(uint64_t seq) {
    for (Copy& c : copies_)
      if (c.seq == seq) return c;
    throw std::logic_error("unknown copy");
  }
  BlockPool& pool_;
  int lag_;
  std::deque<Copy> copies_;
  uint64_t next_ = 1;
};

// `pipelined`: the model prefers sampling on its device, so decode steps are submitted while
// the previous one is in flight and the tier copies start between them (pipelined_step.cpp).
void sessions_through_device_copies(KvPlacementMode mode, size_t disk_blocks, bool pipelined = false) {
  const auto& m = test::stories_model();
  GeneratorOptions g;
  g.n_ctx = 128;
  g.max_sequences = 3;
  g.block_size = 16;
  // Six sessions, three turns: each turn's prompt is the last one, its answer and a message.
  std::vector<std::vector<int32_t>> context;
  for (uint32_t i = 0; i < 6; ++i) context.push_back(test::tier_prompt(40, 300 + i));
  auto gen = test::make_generator(m, g);
  const size_t bb = m.model->kv_shape(16).block_bytes();
  auto opt = test::tier_options(bb, 12, disk_blocks, test::fresh_dir("tier-devcopies"), mode);
  if (mode == KvPlacementMode::Auto) opt.profile_json = test::tier_profile_json(bb);
  g.kv_tiers = opt;
  LaggingCopies* copies = nullptr;
  test::ArgmaxPreferringModel device_sampling(*m.model);
  test::TierFixture f(
      m, g, SchedulerOptions{}, 8,
      [&](BlockPool& pool) {
        auto c = std::make_shared<LaggingCopies>(pool, 3);
        copies = c.get();
        return c;
      },
      pipelined ? &device_sampling : nullptr);
  ASSERT_NE(f.offload, nullptr);
  ASSERT_TRUE(f.tiers->copies_async());
  EXPECT_GE(copies->pins, 1) << "tier 1 page-locked at construction";
  RequestId id = 0;
  for (int turn = 0; turn < 3; ++turn) {
    std::vector<GenerationRequest> reqs;
    for (auto& c : context) reqs.push_back(test::greedy_request(c, 12));
    const auto want = gen.generate(reqs);  // uncapped, no tiers
    const RequestId first = id;
    for (auto& r : reqs) f.add(id++, r);
    f.run();
    for (size_t i = 0; i < reqs.size(); ++i) {
      const auto& got = f.records[first + RequestId(i)].ids;
      ASSERT_EQ(got, want[i].generated_ids) << "turn " << turn << ", session " << i;
      context[i].insert(context[i].end(), got.begin(), got.end());
      for (int k = 0; k < 5; ++k) context[i].push_back(int32_t(3 + (turn * 7 + k * 13 + int(i)) % 500));
    }
  }
  const KvTierMetrics km = f.offload->metrics();
  EXPECT_GT(km.promoted, 0);
  EXPECT_GT(km.prefetches, 0) << "waiting requests' prefixes are brought back ahead of admission";
  EXPECT_GT(km.tiers.prefetch_hits, 0u) << "and claimed once landed";
  EXPECT_EQ(km.lost_tokens, 0);
  EXPECT_EQ(km.failed_promotions, 0);
  EXPECT_GT(copies->queued, 0);
  if (pipelined) {
    EXPECT_GT(device_sampling.chained_tokens, 0) << "no step was submitted before the previous one's ids";
  }
  f.scheduler.clear_prefix_cache();
  EXPECT_EQ(f.pool.n_free(), f.pool.capacity());
  EXPECT_EQ(f.tiers->stats().offloaded_blocks, 0u);
  EXPECT_EQ(f.tiers->in_flight(), 0u);
}

// Two returning sessions whose prefixes both live in tier 1 and do not fit in tier 0 together:
// the prefetch for one must not evict the other's landed prefix (each would undo the other
// forever, and neither be admitted).
TEST(TierDeviceCopies, TwoReturningSessionsDoNotEvictEachOthersPrefetch) {
  const auto& m = test::stories_model();
  GeneratorOptions g;
  g.n_ctx = 128;
  g.max_sequences = 2;
  g.block_size = 16;
  const size_t bb = m.model->kv_shape(16).block_bytes();
  g.kv_tiers = test::tier_options(bb, 32, 0, {}, KvPlacementMode::Host);
  test::TierFixture f(m, g, SchedulerOptions{}, 9,
                      [](BlockPool& pool) { return std::make_shared<LaggingCopies>(pool, 3); });
  std::vector<std::vector<int32_t>> prompts;
  for (uint32_t i = 0; i < 3; ++i) prompts.push_back(test::tier_prompt(97, 500 + i));
  RequestId id = 0;
  for (const auto& p : prompts) {  // A, B, C one at a time: A's and B's blocks go to tier 1
    f.add(id++, test::greedy_request(p, 4));
    f.run();
  }
  f.add(id++, test::greedy_request(prompts[0], 4));  // A and B return together
  f.add(id++, test::greedy_request(prompts[1], 4));
  int steps = 0;
  while (f.scheduler.has_work() && steps < 2000) {
    f.scheduler.step();
    ++steps;
  }
  ASSERT_FALSE(f.scheduler.has_work()) << "no progress after " << steps << " steps";
  // Four tokens each, their prefixes a few steps away: not hundreds of steps of prefixes
  // taking turns in tier 0.
  EXPECT_LT(steps, 60);
  EXPECT_LT(f.offload->metrics().demoted_host, 40);
  EXPECT_EQ(f.records[3].ids, f.records[0].ids);
  EXPECT_EQ(f.records[4].ids, f.records[1].ids);
  EXPECT_GT(f.offload->metrics().promoted, 0);
}

TEST(TierDeviceCopies, ReturningSessionsThroughHostEqualAnUncappedRun) {
  sessions_through_device_copies(KvPlacementMode::Host, 0);
}

TEST(TierDeviceCopies, ReturningSessionsThroughHostAndDiskEqualAnUncappedRun) {
  sessions_through_device_copies(KvPlacementMode::Disk, 64);
}

TEST(TierDeviceCopies, AutoPlacementEqualsAnUncappedRun) {
  sessions_through_device_copies(KvPlacementMode::Auto, 64);
}

TEST(TierDeviceCopies, PipelinedStepsThroughHostAndDiskEqualAnUncappedRun) {
  sessions_through_device_copies(KvPlacementMode::Disk, 64, true);
}

TEST(TierDeviceCopies, PipelinedStepsWithAutoPlacementEqualAnUncappedRun) {
  sessions_through_device_copies(KvPlacementMode::Auto, 64, true);
}

}  // namespace
}  // namespace fdl
