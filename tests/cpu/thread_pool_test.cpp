#include "backend/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace fdl::cpu {
namespace {

TEST(ThreadPool, SizeCountsTheCaller) {
  EXPECT_EQ(ThreadPool(1).size(), 1);
  EXPECT_EQ(ThreadPool(3).size(), 3);
  EXPECT_GE(ThreadPool(0).size(), 1);
  EXPECT_THROW(ThreadPool(-1), std::invalid_argument);
}

TEST(ThreadPool, EveryIndexRunsExactlyOnceInContiguousChunks) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 3, 7, 100, 1001}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::mutex m;
      std::set<int> indices;
      pool.parallel_for(n, [&](int64_t b, int64_t e, int tid) {
        ASSERT_LT(b, e);
        // The split is the documented one: chunk i holds q + (i < m) indices, in order.
        const int64_t q = n / threads, rem = n % threads;
        EXPECT_EQ(b, tid * q + std::min<int64_t>(tid, rem));
        EXPECT_EQ(e - b, q + (tid < rem ? 1 : 0));
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
        std::lock_guard lock(m);
        EXPECT_TRUE(indices.insert(tid).second) << "chunk index used twice";
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 1) << i;
    }
  }
}

TEST(ThreadPool, SeveralChunksPerThreadSplitEvenlyInOrder) {
  ThreadPool pool(3);
  for (int per_thread : {2, 5}) {
    for (int64_t n : {1, 4, 15, 16, 1000}) {
      const int64_t chunks = std::min<int64_t>(n, 3 * per_thread);
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::vector<std::atomic<int>> chunk_seen(static_cast<size_t>(chunks));
      pool.parallel_for(
          n,
          [&](int64_t b, int64_t e, int chunk) {
            ASSERT_GE(chunk, 0);
            ASSERT_LT(chunk, chunks);
            chunk_seen[static_cast<size_t>(chunk)]++;
            const int64_t q = n / chunks, rem = n % chunks;
            EXPECT_EQ(b, chunk * q + std::min<int64_t>(chunk, rem));
            EXPECT_EQ(e - b, q + (chunk < rem ? 1 : 0));
            for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
          },
          per_thread);
      for (auto& h : hits) EXPECT_EQ(h.load(), 1);
      for (auto& c : chunk_seen) EXPECT_EQ(c.load(), 1);
    }
  }
  EXPECT_THROW(pool.parallel_for(10, [](int64_t, int64_t, int) {}, 0), std::invalid_argument);
}

TEST(ThreadPool, BusyThreadLeavesChunksToOthers) {
  // Chunks are claimed, not assigned: while one thread is stuck in its first chunk, the
  // others must be able to finish all the remaining ones.
  ThreadPool pool(2);
  std::atomic<int> done{0};
  pool.parallel_for(
      8,
      [&](int64_t b, int64_t, int) {
        if (b == 0) {
          while (done.load() < 7) std::this_thread::yield();  // waits for all the others
        }
        done++;
      },
      4);
  EXPECT_EQ(done.load(), 8);
}

TEST(ThreadPool, WorkersReallyRunInParallel) {
  ThreadPool pool(2);
  std::set<std::thread::id> ids;
  std::mutex m;
  std::atomic<int> arrived{0};
  pool.parallel_for(2, [&](int64_t, int64_t, int) {
    arrived++;
    while (arrived.load() < 2) std::this_thread::yield();  // needs both threads at once
    std::lock_guard lock(m);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_TRUE(ids.count(std::this_thread::get_id())) << "the caller takes part";
}

TEST(ThreadPool, ManyBackToBackCallsAndSleepWake) {
  ThreadPool pool(3);
  int64_t total = 0;
  std::atomic<int64_t> sum{0};
  for (int call = 0; call < 3000; ++call) {
    pool.parallel_for(10, [&](int64_t b, int64_t e, int) { sum += e - b; });
    total += 10;
  }
  // Let workers fall asleep, then check they wake up.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  pool.parallel_for(10, [&](int64_t b, int64_t e, int) { sum += e - b; });
  total += 10;
  EXPECT_EQ(sum.load(), total);
}

TEST(ThreadPool, ExceptionsPropagateAndPoolStaysUsable) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(9, [](int64_t b, int64_t, int) {
                 if (b >= 3) throw std::runtime_error("worker failed");
               }),
               std::runtime_error);
  EXPECT_THROW(pool.parallel_for(9, [](int64_t b, int64_t, int) {
                 if (b == 0) throw std::out_of_range("caller failed");
               }),
               std::out_of_range);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(9, [&](int64_t b, int64_t e, int) { sum += e - b; });
  EXPECT_EQ(sum.load(), 9);
}

TEST(ThreadPool, NestedCallIsRejected) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(4, [&](int64_t, int64_t, int) {
                 pool.parallel_for(2, [](int64_t, int64_t, int) {});
               }),
               std::logic_error);
}

TEST(ThreadPool, ConcurrentCallersAreSerialized) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  std::atomic<int> inside{0};
  auto body = [&](int64_t b, int64_t e, int) {
    EXPECT_LE(++inside, 2);
    sum += e - b;
    --inside;
  };
  std::thread other([&] {
    for (int i = 0; i < 2000; ++i) pool.parallel_for(8, body);
  });
  for (int i = 0; i < 2000; ++i) pool.parallel_for(8, body);
  other.join();
  EXPECT_EQ(sum.load(), 2 * 2000 * 8);
}

}  // namespace
}  // namespace fdl::cpu
