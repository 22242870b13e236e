// Where splitting a kernel across two threads starts to pay: the fixed cost of one
// parallel_for hand-off, and matmul of the shapes of stories260K and codelm-16m run on one
// thread vs split over the pool (bypassing matmul()'s own rule), for batches of 1..8
// tokens, with the caller writing the input before and reading the output after each call
// as in a forward (a split also moves those cache lines between the cores). Then a cold
// (DRAM-streamed) codelm-16m output projection through matmul() on 1 and N threads. The
// numbers calibrate kParallelMinNs and the estimates of src/backend/cpu/parallel_policy.h
// ("estimate ns" is matmul_cost_ns). Not a Google Benchmark: prints tables.
//
//   bench_parallel_split [--threads T] [--iters I]
// Units: nanoseconds of wall time per call, medians over I calls (hot shapes: the weights
// stay in cache, as a small model's do between decode steps).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/parallel_policy.h"
#include "flashdllm/dtype.h"

namespace {

using Clock = std::chrono::steady_clock;

template <class F>
double median_ns(int iters, F&& f) {
  std::vector<double> v;
  v.reserve(size_t(iters));
  for (int i = -iters / 10 - 1; i < iters; ++i) {
    const auto t0 = Clock::now();
    f();
    const auto t1 = Clock::now();
    if (i >= 0) v.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Shape {
  const char* name;
  fdl::GgmlType type;
  int64_t rows, cols;
};

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{"Cost of a parallel_for hand-off and the 1- vs N-thread crossover of matmul"};
  int threads = 2, iters = 2000;
  app.add_option("--threads", threads, "Pool threads")->check(CLI::Range(2, 256))->capture_default_str();
  app.add_option("--iters", iters, "Timed calls per cell")->check(CLI::Range(10, 1000000))->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  fdl::cpu::ThreadPool pool(threads);

  // The hand-off alone: a parallel_for whose chunks do nothing.
  const fdl::cpu::ThreadPool::RangeFn empty = [](int64_t, int64_t, int) {};
  std::printf("parallel_for, empty chunks: %.0f ns (1 chunk/thread), %.0f ns (4 chunks/thread)\n",
              median_ns(iters, [&] { pool.parallel_for(threads, empty); }),
              median_ns(iters, [&] { pool.parallel_for(64, empty, 4); }));

  const Shape shapes[] = {
      {"stories wq 64x64 f32", fdl::GgmlType::F32, 64, 64},
      {"stories ffn 172x64 f32", fdl::GgmlType::F32, 172, 64},
      {"stories down 64x172 f32", fdl::GgmlType::F32, 64, 172},
      {"stories out 512x64 f32", fdl::GgmlType::F32, 512, 64},
      {"codelm wk 128x384 f16", fdl::GgmlType::F16, 128, 384},
      {"codelm wq 384x384 f16", fdl::GgmlType::F16, 384, 384},
      {"codelm ffn 1024x384 f16", fdl::GgmlType::F16, 1024, 384},
      {"codelm out 8192x384 f16", fdl::GgmlType::F16, 8192, 384},
  };
  const auto rows_fn = fdl::cpu::use_avx2_kernels() ? fdl::cpu::detail::matmul_rows_avx2
                                                    : fdl::cpu::detail::matmul_rows_portable;
  std::printf("\n| shape | tokens | MACs | estimate ns | 1 thread ns | %d threads ns | split / serial |\n"
              "|---|---:|---:|---:|---:|---:|---:|\n",
              threads);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (const Shape& s : shapes) {
    std::vector<unsigned char> w(fdl::cpu::weight_row_bytes(s.type, s.cols) * size_t(s.rows));
    for (size_t i = 0; i < w.size(); i += 2) {
      const uint16_t h = fdl::fp32_to_fp16(dist(rng) * 0.1f);
      std::memcpy(&w[i], &h, 2);  // also fine as F32 bit patterns: small finite values
    }
    const fdl::cpu::WeightMatrix W{s.type, w.data(), s.rows, s.cols};
    for (int n : {1, 2, 4, 6, 8}) {
      std::vector<float> x(size_t(n * s.cols)), y(size_t(n * s.rows));
      for (auto& v : x) v = dist(rng);
      // As in a forward: the caller has just written X (a norm) and reads Y next (the
      // residual add), so a split also moves those cache lines between the cores.
      float sink = 0;
      const auto touch_x = [&] {
        for (auto& v : x) v = -v;
      };
      const auto read_y = [&] {
        for (float v : y) sink += v;
      };
      const double serial = median_ns(iters, [&] {
        touch_x();
        rows_fn(W, x.data(), n, y.data(), 0, s.rows);
        read_y();
      });
      const int64_t units = (s.rows + 15) / 16;
      const double split = median_ns(iters, [&] {
        touch_x();
        pool.parallel_for(
            units,
            [&](int64_t u0, int64_t u1, int) { rows_fn(W, x.data(), n, y.data(), u0 * 16, std::min(u1 * 16, s.rows)); },
            4);
        read_y();
      });
      if (sink == 12345.f) std::printf(" ");
      std::printf("| %s | %d | %lld | %.0f | %.0f | %.0f | %.2f |\n", s.name, n, (long long)(s.rows * s.cols * n),
                  fdl::cpu::matmul_cost_ns(W, n), serial, split, split / serial);
    }
  }
  // Cold weights, as in decoding a model that does not fit in L3: the codelm-16m output
  // projection, cycling through copies totalling 64 MB so each call streams from DRAM.
  {
    const int64_t rows = 8192, cols = 384;
    const size_t bytes = fdl::cpu::weight_row_bytes(fdl::GgmlType::F16, cols) * size_t(rows);
    const int copies = int((64u << 20) / bytes) + 1;
    std::vector<std::vector<unsigned char>> ws(size_t(copies), std::vector<unsigned char>(bytes, 0x11));
    std::printf("\n| cold 8192x384 f16 | tokens | 1 thread ns | %d threads ns | 1 thread GB/s | %d threads GB/s |\n"
                "|---|---:|---:|---:|---:|---:|\n", threads, threads);
    fdl::cpu::ThreadPool one(1);
    for (int n : {1, 2, 4, 6, 8}) {
      std::vector<float> x(size_t(n * cols), 0.5f), y(size_t(n * rows));
      int i = 0;
      auto call = [&](fdl::cpu::ThreadPool& p) {
        const fdl::cpu::WeightMatrix W{fdl::GgmlType::F16, ws[size_t(i++ % copies)].data(), rows, cols};
        fdl::cpu::matmul(p, W, x.data(), n, y.data());
      };
      const double t1 = median_ns(iters / 10 + 10, [&] { call(one); });
      const double tn = median_ns(iters / 10 + 10, [&] { call(pool); });
      std::printf("| | %d | %.0f | %.0f | %.1f | %.1f |\n", n, t1, tn, double(bytes) / t1, double(bytes) / tn);
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_parallel_split: error: %s\n", e.what());
    return 1;
  }
}
