// Micro-benchmarks for the CPU kernels: matmul (GEMV and GEMM) on the shapes of a 110M-param
// Llama (dim 768, ffn 2048, vocab 32000) and, for the K-quants, a 1B one (dim 2048, ffn 5632),
// plus the machine's ceilings to compare against:
// streaming-read memory bandwidth and peak fp32 FMA throughput, with the same thread count.
//
//   bench_matmul --benchmark_filter=... [--benchmark_repetitions=5 --benchmark_report_aggregates_only]
// Environment: FDL_BENCH_THREADS (default 2), FLASHDLLM_NO_AVX2=1 for the portable kernels.
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/q8k_panels.h"
#include "flashdllm/dtype.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

using fdl::GgmlType;
using fdl::cpu::ThreadPool;

int bench_threads() {
  const char* v = std::getenv("FDL_BENCH_THREADS");
  return v ? std::atoi(v) : 2;
}

ThreadPool& pool() {
  static ThreadPool p(bench_threads());
  return p;
}

// Random weights of `type`, encoded once per shape.
std::vector<unsigned char> make_weight_bytes(GgmlType type, int64_t rows, int64_t cols) {
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.f, 0.05f);
  std::vector<float> row(static_cast<size_t>(cols));
  const size_t row_bytes = fdl::cpu::weight_row_bytes(type, cols);
  std::vector<unsigned char> bytes(row_bytes * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& x : row) x = dist(rng);
    unsigned char* d = bytes.data() + static_cast<size_t>(r) * row_bytes;
    switch (type) {
      case GgmlType::F32: std::memcpy(d, row.data(), row_bytes); break;
      case GgmlType::F16:
      case GgmlType::BF16:
        for (int64_t k = 0; k < cols; ++k) {
          const uint16_t h = type == GgmlType::F16 ? fdl::fp32_to_fp16(row[k]) : fdl::fp32_to_bf16(row[k]);
          std::memcpy(d + 2 * k, &h, 2);
        }
        break;
      case GgmlType::Q8_0:
        fdl::quantize_row_q8_0(row.data(), reinterpret_cast<fdl::BlockQ8_0*>(d), static_cast<size_t>(cols));
        break;
      default:  // the block-quantized types: the project's quantizer (make-model's)
        if (fdl::has_quantizer(type)) fdl::quantize_row(type, row.data(), d, static_cast<size_t>(cols));
        break;
    }
  }
  return bytes;
}

// Args: {ggml type id, rows, cols, n_tokens, cold, panels}. cold = 1 cycles through 256 MiB of
// weight copies so every call reads its weights from DRAM, as in a model much larger than the
// L3 cache; cold = 0 re-reads one cache-resident matrix. panels = 1: a K-quant matrix in the
// AVX-512 VNNI kernels' panels (q8k_panels.h), as a loaded model holds it (skipped where
// those kernels cannot run).
void BM_Matmul(benchmark::State& state) {
  const auto type = static_cast<GgmlType>(state.range(0));
  const int64_t rows = state.range(1), cols = state.range(2), n = state.range(3);
  const bool cold = state.range(4) != 0, panels = state.range(5) != 0;
  if (panels && !fdl::cpu::use_avx512_vnni()) {
    state.SkipWithError("no AVX-512 VNNI kernels here");
    return;
  }
  const size_t one = fdl::cpu::weight_row_bytes(type, cols) * static_cast<size_t>(rows);
  const int copies = cold ? static_cast<int>(std::max<size_t>(1, (256u << 20) / one)) : 1;
  std::vector<unsigned char> bytes = make_weight_bytes(type, rows, cols);
  if (panels) fdl::cpu::detail::to_panels(type, bytes.data(), rows, cols);
  std::vector<std::vector<unsigned char>> weights(static_cast<size_t>(copies), bytes);
  std::vector<float> x(static_cast<size_t>(n * cols), 0.01f), y(static_cast<size_t>(n * rows));
  std::mt19937 rng(7);
  std::normal_distribution<float> act(0.f, 1.f);
  for (float& v : x) v = act(rng);  // the integer kernels see every activation level
  int c = 0;
  for (auto _ : state) {
    const fdl::cpu::WeightMatrix w{type, weights[static_cast<size_t>(c)].data(), rows, cols, panels};
    fdl::cpu::matmul(pool(), w, x.data(), n, y.data());
    benchmark::DoNotOptimize(y.data());
    c = (c + 1) % copies;
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * rows * cols * n * iters / 1e9, benchmark::Counter::kIsRate);
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(one) * iters / 1e9, benchmark::Counter::kIsRate);
  state.SetLabel(std::string(fdl::ggml_type_name(static_cast<uint32_t>(type))) + " " +
                 (panels ? "panels" : fdl::cpu::kernel_set_name()) + " threads=" + std::to_string(pool().size()));
}

void MatmulArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"type", "rows", "cols", "tok", "cold", "panels"});
  for (int type : {0, 1, 30, 8}) {
    for (int n : {1, 128})
      for (auto [rows, cols] : {std::pair{768, 768}, {2048, 768}, {768, 2048}, {32000, 768}})
        b->Args({type, rows, cols, n, n == 1 ? 1 : 0, 0});  // decode streams from DRAM
    b->Args({type, 768, 768, 1, 0, 0});                      // decode from cache (small models)
    for (int n : {4, 16}) b->Args({type, 2048, 768, n, 1, 0});  // small batches (drafts, sequences)
  }
  // The integer kernels (Q8_0, Q4_K, Q5_K, Q6_K) on a 1B shape's projections, in rows and
  // in panels: prefill, decode.
  for (int panels : {0, 1})
    for (int type : {8, 12, 13, 14})
      for (auto [rows, cols] : {std::pair{2048, 2048}, {8192, 2048}, {2048, 8192}}) {
        b->Args({type, rows, cols, 128, 0, panels});
        b->Args({type, rows, cols, 1, 1, panels});
      }
  b->UseRealTime();
}
BENCHMARK(BM_Matmul)->Apply(MatmulArgs);

// Dispatch cost of one parallel_for whose chunks do (almost) nothing: the fixed overhead each
// kernel call of a decode step pays for using the pool.
void BM_ParallelForOverhead(benchmark::State& state) {
  std::atomic<int64_t> sink{0};
  const ThreadPool::RangeFn fn = [&sink](int64_t b, int64_t e, int) { sink.fetch_add(e - b, std::memory_order_relaxed); };
  for (auto _ : state) pool().parallel_for(pool().size(), fn);
  benchmark::DoNotOptimize(sink.load());
}
BENCHMARK(BM_ParallelForOverhead)->UseRealTime();

// Streaming read of a buffer much larger than the L3 cache, split across the pool: the
// bandwidth ceiling for GEMV.
void BM_StreamRead(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0)) << 20;
  const size_t n = bytes / sizeof(uint64_t);
  std::unique_ptr<uint64_t[]> buf(new uint64_t[n]);
  for (size_t i = 0; i < n; ++i) buf[i] = i;
  std::vector<uint64_t> sums(64);
  for (auto _ : state) {
    pool().parallel_for(static_cast<int64_t>(n / 8), [&](int64_t b, int64_t e, int chunk) {
      uint64_t acc[8] = {};
      for (int64_t i = b * 8; i < e * 8; i += 8)
        for (int l = 0; l < 8; ++l) acc[l] += buf[static_cast<size_t>(i + l)];
      sums[static_cast<size_t>(chunk)] = acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
    });
    benchmark::DoNotOptimize(sums.data());
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(bytes) * state.iterations() / 1e9,
                                              benchmark::Counter::kIsRate);
}
BENCHMARK(BM_StreamRead)->Arg(512)->UseRealTime();

#if defined(__x86_64__)
// Peak fp32 FMA throughput: 12 independent 8-lane FMA chains per thread (enough to cover
// latency x throughput on current x86 cores), no memory traffic.
__attribute__((target("avx2,fma"))) float fma_chains(int64_t iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.001f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  return _mm_cvtss_f32(_mm256_castps256_ps128(s));
}

void BM_PeakFma(benchmark::State& state) {
  if (!fdl::cpu::cpu_features().fma) {
    state.SkipWithError("no FMA");
    return;
  }
  constexpr int64_t kIters = 1 << 20;
  const int threads = pool().size();
  std::vector<float> out(static_cast<size_t>(threads));
  for (auto _ : state) {
    pool().parallel_for(threads, [&](int64_t b, int64_t, int) { out[static_cast<size_t>(b)] = fma_chains(kIters); });
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * 8 * 12 * kIters * threads * state.iterations() / 1e9,
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PeakFma)->UseRealTime();
#endif

}  // namespace

BENCHMARK_MAIN();
