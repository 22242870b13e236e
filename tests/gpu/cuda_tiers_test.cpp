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

#include "backend/cuda/block_checksum.h"
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

// A 40-token prompt (two full blocks of 16 and 8 more), another sequence's 64 tokens and one
// next token, all random.
struct PromptCase {
  std::vector<int32_t> prompt = std::vector<int32_t>(40), other = std::vector<int32_t>(64);
  int32_t next = 0;
  PromptCase() {
    std::uniform_int_distribution<int32_t> tok(1, 8191);
    for (int32_t& t : prompt) t = tok(rng());
    for (int32_t& t : other) t = tok(rng());
    next = tok(rng());
  }
  std::span<const int32_t> head() const { return {prompt.data(), 32}; }
  std::span<const int32_t> tail() const { return {prompt.data() + 32, 8}; }
  std::span<const int32_t> last() const { return {&next, 1}; }
};

size_t count_differing(const std::vector<float>& got, const std::vector<float>& want) {
  size_t differ = got.size() == want.size() ? 0 : std::max(got.size(), want.size());
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) differ += got[i] != want[i];
  return differ;
}

TEST(CudaTiers, BlocksRoundTripThroughHostAndDiskIntoOtherDeviceSlots) {
  FDL_SKIP_WITHOUT_GPU();
  auto model = Model::load(model_path("codelm-16m-f16.gguf"), ModelOptions{.device = Device::Cuda, .batch_invariant = false});
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
    const PromptCase pc;
    const auto head = pc.head(), tail = pc.tail();
    const auto& other = pc.other;

    // Reference: never leaves the device.
    const SeqId c = kv.create_sequence();
    run(m, kv, c, head, false);
    auto* cm = dynamic_cast<cuda::CudaModel*>(&m);
    ASSERT_NE(cm, nullptr);
    EXPECT_FALSE(cm->kv_host_pinned()) << "pinned before any tier copy (a pool without tiers pays nothing)";
    run(m, kv, c, tail, false);
    const std::vector<float> want = run(m, kv, c, pc.last(), true);

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
    const std::vector<float> got = run(m, kv, b, pc.last(), true);
    EXPECT_EQ(count_differing(got, want), 0u) << "logits after the tier round trip differ from the device-only run";
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
  auto model = Model::load(model_path("codelm-16m-f16.gguf"), ModelOptions{.device = Device::Cuda, .batch_invariant = false});
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
  auto model = Model::load(model_path("codelm-16m-f16.gguf"), ModelOptions{.device = Device::Cuda, .batch_invariant = false});
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

// Asynchronous device copies (the CUDA model's BlockMirror copy interface, through a
// TierManager built after Model::bind_kv_pool): the device checksum kernel against the CPU
// reference; demoted blocks whose device slots are handed out again and overwritten by the
// next forward before their copies were waited for (the write fence), promoted into other
// slots: the next forwards must give bit for bit the logits of a sequence that never left the
// device; promotions queued behind a long prefill are claimed only once they have landed; the
// live and link bandwidth figures.
TEST(CudaTierCopies, ChecksumKernelMatchesTheCpuReference) {
  FDL_SKIP_WITHOUT_GPU();
  // Sizes with an odd number of words and blocks off 16-byte alignment take the kernel's tail paths.
  for (size_t block_bytes : {size_t(8), size_t(24), size_t(2048), size_t(11520), size_t(98304), (size_t(1) << 20) + 8,
                             size_t(2) << 20}) {
    const int n = 5;
    std::vector<uint8_t> host(block_bytes * n);
    for (auto& b : host) b = uint8_t(rng()());
    uint8_t* dev = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), host.size()), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
    int32_t* ids = nullptr;
    uint64_t* sums = nullptr;
    ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&ids), n * sizeof(int32_t), cudaHostAllocMapped), cudaSuccess);
    ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&sums), n * sizeof(uint64_t), cudaHostAllocMapped), cudaSuccess);
    for (int i = 0; i < n; ++i) ids[i] = (i * 3) % n;  // out of order, each once
    cuda::launch_block_checksums(dev, block_bytes, ids, n, sums, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (int i = 0; i < n; ++i)
      EXPECT_EQ(sums[i], block_checksum({host.data() + size_t(ids[i]) * block_bytes, block_bytes}))
          << block_bytes << " bytes, block " << ids[i];
    cudaFree(dev);
    cudaFreeHost(ids);
    cudaFreeHost(sums);
  }
}

// `to_disk`: the second block goes to tier 2 (device -> staging -> file) instead of tier 1.
void round_trip_into_reused_slots(bool to_disk) {
  auto model = Model::load(model_path("codelm-16m-f16.gguf"), ModelOptions{.device = Device::Cuda, .batch_invariant = false});
  Model& m = *model;
  auto pool = make_pool(m, 512);
  const size_t bb = pool->shape().block_bytes();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("fdl-cuda-tier-copies-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  TierConfig cfg;
  cfg.host.bytes = 4 * bb;
  if (to_disk) {
    cfg.disk.bytes = 4 * bb;
    cfg.disk_path = dir;
  }
  m.bind_kv_pool(*pool);
  {
    TierManager tiers(*pool, cfg);
    ASSERT_TRUE(tiers.copies_async());
    const TierStats at_start = tiers.stats();
    EXPECT_GT(at_start.link_h2d_gbps, 1.0);
    EXPECT_GT(at_start.link_d2h_gbps, 1.0);
    std::cout << "  link (one large page-locked transfer): " << at_start.link_h2d_gbps << " GB/s to the device, "
              << at_start.link_d2h_gbps << " GB/s to the host\n";
    KvCache kv(*pool);
    const PromptCase pc;
    const auto head = pc.head(), tail = pc.tail();
    const auto& other = pc.other;

    const SeqId c = kv.create_sequence();  // the reference: never leaves the device
    run(m, kv, c, head, false);
    run(m, kv, c, tail, false);
    const std::vector<float> want = run(m, kv, c, pc.last(), true);

    const SeqId a = kv.create_sequence();
    run(m, kv, a, head, false);
    const std::vector<BlockId> blocks(kv.block_table(a).begin(), kv.block_table(a).begin() + 2);
    for (BlockId b : blocks) pool->retain(b);
    kv.free_sequence(a);
    const TierEvent first = tiers.demote(blocks[0], BlockTier::Host);
    ASSERT_EQ(first.status, TransferStatus::Ok);
    const TierEvent second = tiers.demote(blocks[1], to_disk ? BlockTier::Disk : BlockTier::Host);
    ASSERT_TRUE(second.status == TransferStatus::Ok || second.status == TransferStatus::Pending)
        << to_string(second.status);
    // No wait: the slots are free at once, the next sequence takes them and its forward
    // overwrites them; the device must run the pulls first.
    const SeqId d = kv.create_sequence();
    run(m, kv, d, other, false);
    const auto dt = kv.block_table(d);
    ASSERT_TRUE(std::find(dt.begin(), dt.end(), blocks[0]) != dt.end() &&
                std::find(dt.begin(), dt.end(), blocks[1]) != dt.end())
        << "the pool did not hand the freed slots to the next sequence";

    const std::vector<OffloadId> ids{first.id, second.id};
    tiers.prefetch(ids);
    const TierEvent back0 = tiers.wait_resident(first.id), back1 = tiers.wait_resident(second.id);
    ASSERT_EQ(back0.status, TransferStatus::Ok);
    ASSERT_EQ(back1.status, TransferStatus::Ok);
    const std::vector<BlockId> promoted{back0.block, back1.block};
    const SeqId b = kv.create_sequence_from(promoted);
    for (BlockId id : promoted) pool->release(id);
    run(m, kv, b, tail, false);
    const std::vector<float> got = run(m, kv, b, pc.last(), true);
    EXPECT_EQ(count_differing(got, want), 0u) << "logits after the tier round trip differ from the device-only run";

    const TierStats st = tiers.stats();
    EXPECT_EQ(st.blocks_moved[0][1] + st.blocks_moved[0][2], 2u);
    EXPECT_EQ(st.blocks_moved[1][0] + st.blocks_moved[2][0], 2u);
    EXPECT_GE(st.copy_d2h_bytes, 2 * bb);
    EXPECT_GE(st.copy_h2d_bytes, 2 * bb);
    EXPECT_GT(st.copy_d2h_ms, 0.0);
    kv.free_sequence(b);
    kv.free_sequence(c);
    kv.free_sequence(d);
  }
  std::filesystem::remove_all(dir);
}

TEST(CudaTierCopies, DemotedSlotsReusedAtOnceThenPromotedIntoOthersThroughHost) {
  FDL_SKIP_WITHOUT_GPU();
  round_trip_into_reused_slots(false);
}

TEST(CudaTierCopies, DemotedSlotsReusedAtOnceThenPromotedIntoOthersThroughDisk) {
  FDL_SKIP_WITHOUT_GPU();
  round_trip_into_reused_slots(true);
}

// Promotions queued behind a submitted 1000-token prefill: not ready while it runs (the copy
// waits for the forwards queued before it), ready and verified after, and many blocks at once
// move at a large share of the link's speed.
TEST(CudaTierCopies, PromotionsLandAfterQueuedForwardsAndAreClaimedVerified) {
  FDL_SKIP_WITHOUT_GPU();
  auto model = Model::load(model_path("codelm-16m-f16.gguf"), ModelOptions{.device = Device::Cuda, .batch_invariant = false});
  auto pool = make_pool(*model, 1024 * 16);
  const size_t bb = pool->shape().block_bytes();
  model->bind_kv_pool(*pool);
  TierConfig cfg;
  cfg.host.bytes = 600 * bb;
  TierManager tiers(*pool, cfg);
  ASSERT_TRUE(tiers.copies_async());
  KvCache kv(*pool);
  // 512 blocks of the "device" hold a sequence's KV: fill them by a prefill of 8192 tokens.
  const SeqId s = kv.create_sequence();
  std::vector<int32_t> toks(8192);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t(1 + i % 7000);
  for (size_t at = 0; at < toks.size(); at += 1024)
    run(*model, kv, s, std::span<const int32_t>(toks).subspan(at, 1024), false);
  const std::vector<BlockId> blocks(kv.block_table(s).begin(), kv.block_table(s).end());
  ASSERT_EQ(blocks.size(), 512u);
  std::vector<std::vector<uint8_t>> want(blocks.size(), std::vector<uint8_t>(bb));
  for (size_t i = 0; i < blocks.size(); ++i) {  // the synchronous path's copy, for reference
    pool->pull_from_mirror(blocks[i]);
    std::copy_n(pool->block_bytes(blocks[i]).data(), bb, want[i].data());
  }
  for (BlockId b : blocks) pool->retain(b);
  kv.free_sequence(s);
  std::vector<OffloadId> ids;
  for (BlockId b : blocks) {
    const TierEvent ev = tiers.demote(b, BlockTier::Host);
    ASSERT_EQ(ev.status, TransferStatus::Ok);
    ids.push_back(ev.id);
  }
  tiers.drain();
  tiers.poll();
  // A long forward in flight; the promotions queue behind it.
  const SeqId p = kv.create_sequence();
  StepBatch prefill;
  const size_t first = kv.append_slots(p, 1000);
  for (int i = 0; i < 1000; ++i) prefill.add(1 + i % 500, int32_t(first + size_t(i)), p, i == 999);
  const std::vector<RowSampling> greedy(1);
  model->submit_sample(prefill, kv, greedy, {});
  const auto events = tiers.prefetch(ids);
  for (const TierEvent& ev : events) ASSERT_EQ(ev.status, TransferStatus::Pending);
  tiers.flush();
  std::vector<int32_t> got_ids;
  model->collect_ids(got_ids);
  size_t wrong = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const TierEvent back = tiers.wait_resident(ids[i]);
    ASSERT_EQ(back.status, TransferStatus::Ok) << i;
    std::vector<uint8_t> dev(bb);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    pool->pull_from_mirror(back.block);
    wrong += !std::equal(want[i].begin(), want[i].end(), pool->block_bytes(back.block).begin());
    pool->release(back.block);
  }
  EXPECT_EQ(wrong, 0u) << "promoted blocks whose device bytes are not the demoted ones";
  const TierStats st = tiers.stats();
  const double d2h = double(st.copy_d2h_bytes) / (st.copy_d2h_ms * 1e6),
               h2d = double(st.copy_h2d_bytes) / (st.copy_h2d_ms * 1e6);
  std::cout << "  512 blocks of " << bb << " bytes each way: " << d2h << " GB/s to the host, " << h2d
            << " GB/s to the device (device time of the copy groups, checksums included); link " << st.link_d2h_gbps
            << " / " << st.link_h2d_gbps << " GB/s\n";
  EXPECT_GT(d2h, 0.25 * st.link_d2h_gbps);  // 64 KiB blocks: per-copy costs weigh; pageable copies read < 0.1
  EXPECT_GT(h2d, 0.25 * st.link_h2d_gbps);
  kv.free_sequence(p);
}

}  // namespace
}  // namespace fdl::test
