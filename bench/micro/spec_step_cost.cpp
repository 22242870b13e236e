// The cost of one decode forward as a function of its batch size: what speculative
// verification pays for a window of k drafts (k + 1 tokens of one sequence in one forward)
// against a plain 1-token step. Not a Google Benchmark: it prints one table.
//
//   bench_spec_step_cost MODEL.gguf [--threads T] [--context L] [--min-tokens M] [--max-tokens N] [--iters I]
//
// A sequence is prefilled with L tokens (default 200), then for n = 1 and M..N (default 1..9) the
// forward of n tokens at positions L..L+n-1 runs I times (default 300), truncating back to L
// after each. The runs of one n are consecutive, as in decoding (a 1-token step right after
// a 9-token one finds less of the weights in L3 than one after another 1-token step), in 10
// rounds over n = 1..N so drift of a shared machine hits every n alike; the first run of each
// n in a round is a warm-up and not timed. Printed per n: the median and the 20th percentile
// (less disturbed by other processes) forward time in µs, and their ratio to n = 1.
// Units: microseconds of wall time.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "flashdllm/kv_cache.h"
#include "flashdllm/model.h"

namespace {

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{"Forward cost of a decode step by batch size (speculative verification vs plain)"};
  std::string model_path;
  int threads = 1, context = 200, min_tokens = 1, max_tokens = 9, iters = 300;
  app.add_option("model", model_path, "GGUF model file")->required();
  app.add_option("--threads", threads, "Worker threads")->check(CLI::Range(1, 256))->capture_default_str();
  app.add_option("--context", context, "Prefilled context (tokens)")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--min-tokens", min_tokens, "Smallest batch timed besides 1 (for profiling one size)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--max-tokens", max_tokens, "Largest batch timed")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--iters", iters, "Timed forwards per batch size")->check(CLI::Range(10, 1000000))->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  fdl::ModelOptions opt;
  opt.n_threads = threads;
  auto model = fdl::Model::load(model_path, opt);
  const int n_vocab = model->config().n_vocab;
  const int block = 16;
  fdl::BlockPool pool(model->kv_shape(block), static_cast<size_t>((context + max_tokens + block) / block + 1));
  fdl::KvCache kv(pool);
  const fdl::SeqId seq = kv.create_sequence();
  fdl::StepBatch batch;
  const size_t first = kv.append_slots(seq, static_cast<size_t>(context));
  for (int i = 0; i < context; ++i)
    batch.add(static_cast<int32_t>((i * 7919 + 13) % n_vocab), static_cast<int32_t>(first + size_t(i)), seq,
              i + 1 == context);
  std::vector<float> logits;
  model->forward(batch, kv, logits);

  std::vector<std::vector<double>> us(static_cast<size_t>(max_tokens) + 1);
  constexpr int kRounds = 10;
  for (int round = 0; round < kRounds; ++round)
    for (int n = 1; n <= max_tokens; n = n == 1 ? std::max(2, min_tokens) : n + 1)
      for (int it = -1; it < std::max(1, iters / kRounds); ++it) {
        batch.clear();
        const size_t pos = kv.append_slots(seq, static_cast<size_t>(n));
        for (int i = 0; i < n; ++i)
          batch.add(static_cast<int32_t>((i * 31 + 5) % n_vocab), static_cast<int32_t>(pos + size_t(i)), seq, true);
        const auto t0 = std::chrono::steady_clock::now();
        model->forward(batch, kv, logits);
        const auto t1 = std::chrono::steady_clock::now();
        kv.truncate(seq, static_cast<size_t>(context));
        if (it >= 0) us[size_t(n)].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
  std::printf("model %s, %d thread(s), context %d, kernels %s%s, %d iterations\n", model_path.c_str(), threads,
              context, fdl::cpu::kernel_set_name(), fdl::cpu::use_avx512_tiles() ? " (AVX-512VL tiles from 4 tokens)" : "",
              iters);
  std::printf("| tokens | median us | p20 us | median / 1-token | p20 / 1-token |\n|---:|---:|---:|---:|---:|\n");
  const double m1 = percentile(us[1], 0.5), p1 = percentile(us[1], 0.2);
  for (int n = 1; n <= max_tokens; n = n == 1 ? std::max(2, min_tokens) : n + 1) {
    const double m = percentile(us[size_t(n)], 0.5), p = percentile(us[size_t(n)], 0.2);
    std::printf("| %d | %.0f | %.0f | %.2f | %.2f |\n", n, m, p, m / m1, p / p1);
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_spec_step_cost: error: %s\n", e.what());
    return 1;
  }
}
