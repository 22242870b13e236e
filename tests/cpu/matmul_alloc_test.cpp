// matmul and ThreadPool::parallel_for must not touch the heap once warmed up: a decode step
// issues dozens of them. Counts global operator new calls around a second, identical call.
// matmul runs on a one-thread pool here: its scratch is per thread, and which pool thread
// runs which chunk is decided at run time, so only the caller's warm-up is deterministic.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "backend/cpu/matmul.h"
#include "cpu_test_util.h"

namespace {
std::atomic<long> g_allocations{0};
}  // namespace

// Replaceable global allocation functions (counting only; they forward to malloc/free).
// GCC's -Wmismatched-new-delete cannot see that these replacements pair malloc with free.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
// Over-aligned types (the kernels' 32-byte panel lanes) use the aligned forms.
void* operator new(std::size_t n, std::align_val_t al) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  const auto a = static_cast<std::size_t>(al);
  if (void* p = std::aligned_alloc(a, (n + a - 1) / a * a + (n == 0 ? a : 0))) return p;
  throw std::bad_alloc();
}
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace fdl::cpu {
namespace {

TEST(MatmulAllocations, NoHeapAllocationAfterWarmUp) {
  for (bool portable : {false, true}) {
    test::KernelSetGuard guard(portable);
    ThreadPool pool(1);
    for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0}) {
      const auto w = test::make_weights(type, 96, 256, 3);
      for (int64_t n : {1, 2, 40}) {
        const auto x = test::random_floats(static_cast<size_t>(n * w.cols), 4);
        std::vector<float> y(static_cast<size_t>(n * w.rows));
        matmul(pool, w.view(), x.data(), n, y.data());  // warm-up: per-thread scratch grows
        const long before = g_allocations.load();
        matmul(pool, w.view(), x.data(), n, y.data());
        EXPECT_EQ(g_allocations.load() - before, 0) << test::type_label(type) << " n=" << n
                                                    << (portable ? " portable" : " avx2");
      }
    }
  }
}

TEST(ThreadPoolAllocations, ParallelForDoesNotAllocate) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  const ThreadPool::RangeFn fn = [&sum](int64_t b, int64_t e, int) { sum += e - b; };
  pool.parallel_for(100, fn);
  const long before = g_allocations.load();
  for (int i = 0; i < 100; ++i) pool.parallel_for(100, fn);
  EXPECT_EQ(g_allocations.load() - before, 0);
  EXPECT_EQ(sum.load(), 101 * 100);
}

}  // namespace
}  // namespace fdl::cpu
