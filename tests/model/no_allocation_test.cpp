// After warm-up, a forward step allocates no heap memory: scratch buffers are sized by the
// largest batch seen and reused. Counted by replacing the global operator new for this test
// binary (the count is only consulted inside the measured region).
#include <atomic>
#include <cstdlib>
#include <new>

#include "model/model_test_util.h"

namespace {
std::atomic<long> g_news{0};
}  // namespace

void* operator new(std::size_t n) {
  g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
// GCC cannot see that these deletes pair with the mallocs above.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace fdl::test {
namespace {

class NoAllocation : public ::testing::TestWithParam<std::string> {};

TEST_P(NoAllocation, ForwardAllocatesNothingAfterWarmUp) {
  Model& m = shared_model(GetParam(), 2);
  auto pool = make_pool(m, 4 * 96);
  KvCache kv(*pool);
  std::vector<SeqId> seqs;
  StepBatch batch;
  batch.tokens.reserve(64);
  batch.positions.reserve(64);
  batch.seqs.reserve(64);
  batch.want_logits.reserve(64);
  std::vector<float> logits;
  // Warm-up: the largest batch (a 16-token prefill of 4 sequences) and a long enough context.
  for (int s = 0; s < 4; ++s) {
    seqs.push_back(kv.create_sequence());
    const size_t first = kv.append_slots(seqs.back(), 16);
    for (int i = 0; i < 16; ++i) batch.add(1 + i, int32_t(first + size_t(i)), seqs.back(), true);
  }
  m.forward(batch, kv, logits);
  for (int step = 0; step < 40; ++step) {
    batch.clear();
    for (SeqId s : seqs) batch.add(3, int32_t(kv.append_slots(s, 1)), s, true);
    m.forward(batch, kv, logits);
  }
  for (SeqId s : seqs) kv.truncate(s, 16);
  // Measured: decode steps at shorter contexts than the warm-up's, batches of 1..4.
  const long before = g_news.load();
  for (int step = 0; step < 20; ++step) {
    batch.clear();
    for (size_t k = 0; k <= size_t(step) % seqs.size(); ++k)
      batch.add(5, int32_t(kv.append_slots(seqs[k], 1)), seqs[k], true);
    m.forward(batch, kv, logits);
  }
  EXPECT_EQ(g_news.load() - before, 0) << "heap allocations during 20 forward steps";
}

INSTANTIATE_TEST_SUITE_P(Models, NoAllocation,
                         ::testing::Values("stories260K.gguf", "codelm-16m-f16.gguf"),
                         [](const auto& info) {
                           return info.param.find("stories") == 0 ? std::string("stories260K")
                                                                   : std::string("codelm16m");
                         });

}  // namespace
}  // namespace fdl::test
