// Copy-on-write of forked KV blocks on the CUDA model: fork_sequence + append_slots copies a
// shared partial tail block in the host arena; the model must mirror each copy in its device
// arena (KvCache block-copy observer), so a forked sequence's logits equal those of a run
// that never forked.
#include "backend/cuda/cuda_model.h"
#include "gpu/gpu_test_util.h"
#include "model/model_test_util.h"

namespace fdl::test {
namespace {

// Two instances of the same model: the CUDA model keeps a device arena for one BlockPool at
// a time (a forward with another pool re-allocates it, dropping the device K/V), so the
// forked run and the unforked references must not share one model.
Model& fork_model() {
  static std::unique_ptr<Model> m =
      Model::load(model_path("codelm-16m-f16.gguf"), ModelOptions{.device = Device::Cuda, .batch_invariant = false});
  return *m;
}
Model& reference_model() {
  static std::unique_ptr<Model> m =
      Model::load(model_path("codelm-16m-f16.gguf"), ModelOptions{.device = Device::Cuda, .batch_invariant = false});
  return *m;
}

/// Logits after feeding `prompt` in one forward, then each of `extra` in its own forward, in a
/// fresh cache that never forks (the reference), on reference_model().
std::vector<float> unforked_logits(const std::vector<int32_t>& prompt, const std::vector<int32_t>& extra) {
  Model& m = reference_model();
  auto pool = make_pool(m, 64);
  KvCache kv(*pool);
  const SeqId s = kv.create_sequence();
  StepBatch b;
  std::vector<float> logits;
  const size_t f = kv.append_slots(s, prompt.size());
  for (size_t i = 0; i < prompt.size(); ++i) b.add(prompt[i], int32_t(f + i), s, false);
  m.forward(b, kv, logits);
  for (int32_t t : extra) {
    b.clear();
    b.add(t, int32_t(kv.append_slots(s, 1)), s, true);
    m.forward(b, kv, logits);
  }
  return logits;
}

double rel(const std::vector<float>& got, const std::vector<float>& ref) {
  return rel_error(got, std::vector<double>(ref.begin(), ref.end()));
}

TEST(CudaFork, CopyOnWriteOfSharedTailBlocksMatchesUnforkedRuns) {
  FDL_SKIP_WITHOUT_GPU();
  Model& m = fork_model();
  const int V = m.config().n_vocab;
  std::vector<int32_t> prompt;
  std::uniform_int_distribution<int32_t> tok(1, 8191);
  for (int i = 0; i < 21; ++i) prompt.push_back(tok(rng()));  // 21 = one full block + 5 of 16
  const int32_t x = 101, y = 202, z = 303, w = 404;

  auto pool = make_pool(m, 256);
  KvCache kv(*pool);
  const SeqId a = kv.create_sequence();
  StepBatch batch;
  std::vector<float> logits;
  size_t f = kv.append_slots(a, prompt.size());
  for (size_t i = 0; i < prompt.size(); ++i) batch.add(prompt[i], int32_t(f + i), a, false);
  m.forward(batch, kv, logits);

  // Two forks of a, each appending into the shared tail: two copies before the next forward.
  const SeqId b = kv.fork_sequence(a), c = kv.fork_sequence(a);
  batch.clear();
  batch.add(x, int32_t(kv.append_slots(b, 1)), b, true);
  batch.add(y, int32_t(kv.append_slots(c, 1)), c, true);
  ASSERT_EQ(kv.blocks_copied(), 2u);
  m.forward(batch, kv, logits);
  ASSERT_EQ(logits.size(), size_t(2) * V);
  const std::vector<float> got_b(logits.begin(), logits.begin() + V), got_c(logits.begin() + V, logits.end());
  EXPECT_LT(rel(got_b, unforked_logits(prompt, {x})), 1e-5);
  EXPECT_LT(rel(got_c, unforked_logits(prompt, {y})), 1e-5);

  // A fork of a fork: copies b's private tail (itself a copy) while a, untouched by the
  // copies, also decodes in the same step.
  const SeqId d = kv.fork_sequence(b);
  batch.clear();
  batch.add(z, int32_t(kv.append_slots(d, 1)), d, true);
  batch.add(w, int32_t(kv.append_slots(a, 1)), a, true);
  ASSERT_EQ(kv.blocks_copied(), 3u);
  m.forward(batch, kv, logits);
  ASSERT_EQ(logits.size(), size_t(2) * V);
  const std::vector<float> got_d(logits.begin(), logits.begin() + V), got_a(logits.begin() + V, logits.end());
  EXPECT_LT(rel(got_d, unforked_logits(prompt, {x, z})), 1e-5);
  EXPECT_LT(rel(got_a, unforked_logits(prompt, {w})), 1e-5);

  // The copied blocks keep serving later steps.
  batch.clear();
  batch.add(x, int32_t(kv.append_slots(d, 1)), d, true);
  m.forward(batch, kv, logits);
  EXPECT_LT(rel(logits, unforked_logits(prompt, {x, z, x})), 1e-5);
}

TEST(CudaFork, CopyLogsOfEarlierPoolsAreDropped) {
  FDL_SKIP_WITHOUT_GPU();
  // Every unforked_logits call runs a fresh pool and cache on reference_model(): the model
  // keeps the copy-on-write log of the current pool's cache only.
  auto& cm = dynamic_cast<cuda::CudaModel&>(reference_model());
  for (int i = 0; i < 3; ++i) {
    unforked_logits({1, 2, 3, 4, 5}, {6});
    EXPECT_EQ(cm.tracked_caches(), 1u) << "after pool " << i;
  }
}

TEST(CudaFork, CopyLogsOfDestroyedCachesAreDropped) {
  FDL_SKIP_WITHOUT_GPU();
  // Many caches over one pool, one after another (the pool, and so the arena, stays): the
  // model keeps the bookkeeping of live caches only.
  Model& m = fork_model();
  auto& cm = dynamic_cast<cuda::CudaModel&>(m);
  auto pool = make_pool(m, 64);
  StepBatch batch;
  std::vector<float> logits;
  KvCache keep(*pool);
  const SeqId k = keep.create_sequence();
  batch.add(3, int32_t(keep.append_slots(k, 1)), k, true);
  m.forward(batch, keep, logits);
  for (int i = 0; i < 4; ++i) {
    KvCache kv(*pool);
    const SeqId a = kv.create_sequence();
    batch.clear();
    batch.add(int32_t(5 + i), int32_t(kv.append_slots(a, 1)), a, true);
    m.forward(batch, kv, logits);
    EXPECT_EQ(cm.tracked_caches(), 2u) << "cache " << i << " and the kept one";
  }
  batch.clear();
  batch.add(4, int32_t(keep.append_slots(k, 1)), k, true);
  m.forward(batch, keep, logits);
  EXPECT_EQ(cm.tracked_caches(), 1u) << "only the kept cache is alive";
  // The kept cache's bookkeeping survived the pruning: a copy the model never heard of is
  // still caught.
  keep.set_block_copy_observer({});
  const SeqId f = keep.fork_sequence(k);
  batch.clear();
  batch.add(6, int32_t(keep.append_slots(f, 1)), f, true);
  EXPECT_THROW(m.forward(batch, keep, logits), std::logic_error);
}

TEST(CudaFork, ReplacedObserverIsDetectedInsteadOfReadingStaleBlocks) {
  FDL_SKIP_WITHOUT_GPU();
  Model& m = fork_model();
  auto pool = make_pool(m, 64);
  KvCache kv(*pool);
  const SeqId a = kv.create_sequence();
  StepBatch batch;
  std::vector<float> logits;
  size_t f = kv.append_slots(a, 3);
  for (size_t i = 0; i < 3; ++i) batch.add(int32_t(7 + i), int32_t(f + i), a, false);
  m.forward(batch, kv, logits);
  kv.set_block_copy_observer({});  // someone else takes the hook: the model never hears of the copy
  const SeqId b = kv.fork_sequence(a);
  batch.clear();
  batch.add(9, int32_t(kv.append_slots(b, 1)), b, true);
  EXPECT_THROW(m.forward(batch, kv, logits), std::logic_error);
}

}  // namespace
}  // namespace fdl::test
