// KV tiers with the CUDA model: the device arena is the authoritative copy of tier-0 blocks,
// so a demotion must pull a block's bytes from the device and a promotion push them back
// (CudaModel registers itself as the pool's BlockMirror). Two blocks of a prefilled prompt go
// to host memory and to disk, the device slots they left are overwritten by another sequence,
// and the blocks come back into other slots: the next forwards must give bit for bit the
// logits of a sequence that never left the device (same chunking, same kernels).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>

#include "backend/cuda/cuda_model.h"
#include "flashdllm/kv_tiers.h"
#include "gpu/gpu_test_util.h"
#include "model/model_test_util.h"

namespace fdl::test {
namespace {

std::vector<float> run(Model& m, KvCache& kv, SeqId seq, std::span<const int32_t> tokens, bool logits) {
  StepBatch b;
  const size_t f = kv.append_slots(seq, tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) b.add(tokens[i], int32_t(f + i), seq, logits && i + 1 == tokens.size());
  std::vector<float> out;
  m.forward(b, kv, out);
  return out;
}

TEST(CudaTiers, BlocksRoundTripThroughHostAndDiskIntoOtherDeviceSlots) {
  FDL_SKIP_WITHOUT_GPU();
  auto model = Model::load(model_path("codelm-16m-f16.gguf"), ModelOptions{.device = Device::Cuda});
  Model& m = *model;
  auto pool = make_pool(m, 512);  // block size 16
  ASSERT_EQ(pool->shape().block_size, 16);
  const size_t bb = pool->shape().block_bytes();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("fdl-cuda-tiers-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  TierConfig cfg;
  cfg.host.bytes = 4 * bb;
  cfg.disk.bytes = 4 * bb;
  cfg.disk_path = dir;
  {
    TierManager tiers(*pool, cfg);
    KvCache kv(*pool);
    std::uniform_int_distribution<int32_t> tok(1, 8191);
    std::vector<int32_t> prompt(40), other(64);
    for (int32_t& t : prompt) t = tok(rng());
    for (int32_t& t : other) t = tok(rng());
    const int32_t next = tok(rng());
    const std::span<const int32_t> head(prompt.data(), 32), tail(prompt.data() + 32, 8);

    // Reference: never leaves the device.
    const SeqId c = kv.create_sequence();
    run(m, kv, c, head, false);
    auto* cm = dynamic_cast<cuda::CudaModel*>(&m);
    ASSERT_NE(cm, nullptr);
    EXPECT_FALSE(cm->kv_host_pinned()) << "pinned before any tier copy (a pool without tiers pays nothing)";
    run(m, kv, c, tail, false);
    const std::vector<float> want = run(m, kv, c, std::span<const int32_t>(&next, 1), true);

    // The same prefix; its two full blocks leave tier 0 (we hold their only references).
    const SeqId a = kv.create_sequence();
    run(m, kv, a, head, false);
    const std::vector<BlockId> blocks(kv.block_table(a).begin(), kv.block_table(a).begin() + 2);
    for (BlockId b : blocks) pool->retain(b);
    kv.free_sequence(a);
    const TierEvent to_host = tiers.demote(blocks[0], BlockTier::Host);
    ASSERT_EQ(to_host.status, TransferStatus::Ok);
    // The first tier copy pinned the pool's host arena: copies are DMA (on the H200; a
    // system that refuses to pin falls back to pageable copies).
    EXPECT_TRUE(cm->kv_host_pinned()) << "the pool's host arena was not page-locked";
    TierEvent to_disk = tiers.demote(blocks[1], BlockTier::Disk);
    if (to_disk.status == TransferStatus::TierDisabled) {  // no usable disk here: host for both
      std::cout << "  disk tier unavailable; both blocks go to host memory\n";
      to_disk = tiers.demote(blocks[1], BlockTier::Host);
    }
    ASSERT_TRUE(to_disk.status == TransferStatus::Ok || to_disk.status == TransferStatus::Pending);
    tiers.drain();
    tiers.poll();

    // Another sequence takes the freed slots and overwrites their device copies.
    const SeqId d = kv.create_sequence();
    run(m, kv, d, other, false);
    const auto dt = kv.block_table(d);
    ASSERT_TRUE(std::find(dt.begin(), dt.end(), blocks[0]) != dt.end() &&
                std::find(dt.begin(), dt.end(), blocks[1]) != dt.end())
        << "the pool did not hand the freed slots to the next sequence (free-list order changed?)";

    const TierEvent back0 = tiers.wait_resident(to_host.id), back1 = tiers.wait_resident(to_disk.id);
    ASSERT_EQ(back0.status, TransferStatus::Ok);
    ASSERT_EQ(back1.status, TransferStatus::Ok);
    const std::vector<BlockId> promoted{back0.block, back1.block};
    for (BlockId b : promoted) EXPECT_TRUE(b != blocks[0] && b != blocks[1]) << "promoted into a slot " << b << " it left";
    const SeqId b = kv.create_sequence_from(promoted);
    for (BlockId id : promoted) pool->release(id);  // the sequence holds them now
    run(m, kv, b, tail, false);
    const std::vector<float> got = run(m, kv, b, std::span<const int32_t>(&next, 1), true);
    ASSERT_EQ(got.size(), want.size());
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
    EXPECT_EQ(differ, 0u) << "logits after the tier round trip differ from the device-only run";
    kv.free_sequence(b);
    kv.free_sequence(c);
    kv.free_sequence(d);
  }
  std::filesystem::remove_all(dir);
}

// A push only queues its copy (the host goes on); the host arena may be rewritten only through
// block_bytes_for_write, which waits for that block's pushes: the device must hold the pushed
// bytes, not the ones written after. The pushes queue behind a submitted 1000-token prefill,
// so without the wait the host would rewrite the bytes long before the copies read them (the
// last pushed block first).
TEST(CudaTiers, PushesReadTheHostArenaBeforeItIsRewritten) {
  FDL_SKIP_WITHOUT_GPU();
  auto model = Model::load(model_path("codelm-16m-f16.gguf"), ModelOptions{.device = Device::Cuda});
  auto* cm = dynamic_cast<cuda::CudaModel*>(model.get());
  ASSERT_NE(cm, nullptr);
  auto pool = make_pool(*model, 512 * 16);  // 512 blocks
  KvCache kv(*pool);
  const SeqId s = kv.create_sequence();
  run(*model, kv, s, std::vector<int32_t>{1, 2, 3}, true);  // the device arena exists
  const size_t n = 128, bb = pool->shape().block_bytes();
  std::vector<BlockId> ids;
  for (size_t i = 0; i < n; ++i) ids.push_back(pool->allocate());
  auto expected = [&](BlockId id, uint8_t seed, size_t i) { return uint8_t(seed + i * 13 + size_t(id)); };
  auto fill = [&](BlockId id, uint8_t seed) {
    auto bytes = pool->block_bytes_for_write(id);
    for (size_t i = 0; i < bb; ++i) bytes[i] = expected(id, seed, i);
  };
  for (const BlockId id : ids) fill(id, 1);
  const SeqId p = kv.create_sequence();
  StepBatch prefill;
  const int tokens = 1000;
  const size_t first = kv.append_slots(p, size_t(tokens));
  for (int i = 0; i < tokens; ++i) prefill.add(1 + i % 500, int32_t(first + size_t(i)), p, i + 1 == tokens);
  const std::vector<RowSampling> greedy(1);
  model->submit_sample(prefill, kv, greedy, {});
  for (const BlockId id : ids) pool->push_to_mirror(id);
  EXPECT_TRUE(cm->kv_host_pinned()) << "pageable pushes are staged before they return: nothing to test";
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) fill(*it, 2);  // each waits for its push first
  std::vector<int32_t> got;
  model->collect_ids(got);
  EXPECT_EQ(got.size(), 1u);
  size_t wrong = 0;
  for (const BlockId id : ids) {
    pool->pull_from_mirror(id);  // the device's bytes back into the host arena
    const auto bytes = pool->block_bytes(id);
    for (size_t i = 0; i < bb; ++i) wrong += bytes[i] != expected(id, 1, i);
  }
  EXPECT_EQ(wrong, 0u) << "bytes on the device that were written on the host after their push";
  for (const BlockId id : ids) pool->release(id);
  kv.free_sequence(p);
  kv.free_sequence(s);
}

// The pin follows the pool: taken at the first tier copy, released when the pool closes first
// (another pool then gets its own), or when the model goes first (the pool then frees its
// arena untouched).
TEST(CudaTiers, HostArenaPinFollowsThePoolsLifetime) {
  FDL_SKIP_WITHOUT_GPU();
  auto model = Model::load(model_path("codelm-16m-f16.gguf"), ModelOptions{.device = Device::Cuda});
  auto* cm = dynamic_cast<cuda::CudaModel*>(model.get());
  ASSERT_NE(cm, nullptr);
  const std::vector<int32_t> prompt = {11, 22, 33, 44, 55};
  auto registered = [](const void* p) {
    unsigned flags = 0;
    const bool yes = cudaHostGetFlags(&flags, const_cast<void*>(p)) == cudaSuccess;
    (void)cudaGetLastError();
    return yes;
  };
  for (int round = 0; round < 2; ++round) {
    auto pool = make_pool(*model, 64);
    KvCache kv(*pool);
    const SeqId s = kv.create_sequence();
    EXPECT_FALSE(run(*model, kv, s, prompt, true).empty());
    EXPECT_FALSE(cm->kv_host_pinned()) << "round " << round << ": pinned without a tier copy";
    const BlockId b = kv.block_table(s)[0];
    const size_t bytes = pool->shape().block_bytes();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 20; ++i) pool->pull_from_mirror(b);
    const auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < 20; ++i) pool->push_to_mirror(b);  // queued: the host does not wait
    const auto t2 = std::chrono::steady_clock::now();
    (void)pool->block_bytes_for_write(b);  // waits for the pushes
    const auto t3 = std::chrono::steady_clock::now();
    EXPECT_TRUE(cm->kv_host_pinned()) << "round " << round;
    EXPECT_TRUE(registered(pool->arena_bytes().data()));
    if (round == 0) {  // what a tier copy of one block costs (printed; PCIe ~50 GB/s pinned)
      auto sec = [](auto a, auto z) { return std::chrono::duration<double>(z - a).count(); };
      std::cout << "  tier copies of a " << bytes << "-byte block (pinned; the first pull includes pinning): pull "
                << 20.0 * double(bytes) / sec(t0, t1) / 1e9 << " GB/s; 20 pushes queued in " << sec(t1, t2) * 1e6
                << " us, done after " << sec(t1, t3) * 1e6 << " us (" << 20.0 * double(bytes) / sec(t1, t3) / 1e9
                << " GB/s)\n";
    }
    // The pushes wrote back the device's own bytes: the sequence continues as before.
    EXPECT_FALSE(run(*model, kv, s, std::vector<int32_t>{66}, true).empty());
    kv.free_sequence(s);
  }  // the pool closes: its pin is released, the model's mirror is left unpinned
  EXPECT_FALSE(cm->kv_host_pinned());
  auto pool = make_pool(*model, 64);
  {
    KvCache kv(*pool);
    const SeqId s = kv.create_sequence();
    run(*model, kv, s, prompt, false);
    pool->pull_from_mirror(kv.block_table(s)[0]);
    EXPECT_TRUE(registered(pool->arena_bytes().data()));
    kv.free_sequence(s);
  }
  model.reset();  // the model (and its mirror) first: the pin goes with it
  EXPECT_FALSE(registered(pool->arena_bytes().data())) << "the arena stayed page-locked after the model went";
  pool.reset();  // and the pool's destructor must not call the dead mirror
}

}  // namespace
}  // namespace fdl::test
