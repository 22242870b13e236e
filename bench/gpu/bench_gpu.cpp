// bench_gpu — decode and prefill timings of the CUDA model (the CUDA backend's benchmark).
//
//   bench_gpu -m model.gguf [--prompt 512] [--gen 128] [--batches 1,64] [--reps 3] [--sampling]
//             [--trace] [--kv-cache-dtype auto|f32|f16|bf16] [--json out.json]
//
// Per batch size B (B sequences, each with its own random prompt of --prompt ids, seed 42):
//  - prefill: one forward per sequence over its whole prompt (logits for the last token
//    only); TTFT = that forward + the first greedy id, for B = 1;
//  - decode: --gen steps, each one forward of B tokens (one per sequence) returning only the
//    greedy ids (argmax on the GPU: CudaModel::forward_argmax); tok/s = B*gen / decode time;
//    inter-token σ = standard deviation of the step times;
//  - HBM bandwidth per decode step = (weight bytes streamed + KV bytes read) / median step
//    time, against the measured 4.26 TB/s of the H200 (docs/GPU.md);
//  - pipelined: the same greedy decode through Model::submit_sample / collect_ids: step k+1
//    is queued (its tokens previous_step_id, drawn on the device) before step k's ids come
//    back, so the GPU never waits for the host between steps; step time = from one collect
//    to the next (the first also holds the first submit);
//  - for B = 1 also the decode rate with full logits copied to the host (Model::forward);
//  - with --sampling, for every B also decode with llama.cpp's default sampler settings
//    (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05): sampled on the GPU
//    (CudaModel::forward_sample, ids only cross PCIe) and sampled on the host (forward, then
//    one fdl::Sampler per sequence over the copied rows).
// The same call measures the device's copy bandwidth first (cudaMemcpy device to device of
// 4 GiB, counted as read + write, median of 9), the measurement the 4.26 TB/s above comes
// from: the roofline of batch-1 decode is that bandwidth over the weight bytes, and each
// decode line also gives its share of it, since machines of one kind differ by ~1-2%.
// Two untimed warm-up runs per B and mode (they fill the KV arena and scratch and tune the
// GEMMs; a prompt-sized step is captured into a CUDA graph the second time its shape occurs,
// and that capture, ~3 ms, must not land in a timed TTFT). Reports the median over --reps
// repetitions. --trace (batch 1) also prints where the time of a layer goes:
// the persistent decode kernels' phase stamps (CudaModel::decode_trace).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "int_list.h"
#include "backend/cuda/cuda_model.h"
#include "flashdllm/kv_cache.h"
#include "flashdllm/model.h"
#include "flashdllm/sampling.h"

namespace {

using Clock = std::chrono::steady_clock;
double ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : (v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]));
}
double stddev(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  double s = 0;
  for (double x : v) s += (x - mean) * (x - mean);
  return std::sqrt(s / double(v.size() - 1));
}

struct RunResult {
  double prefill_ms = 0, ttft_ms = 0, decode_ms = 0;
  std::vector<double> steps;
  double kv_bytes_read = 0;  // summed over steps
};

// With FLASHDLLM_CUDA_PROFILE=1: device ms per op class, for `what`, divided by `per`.
void print_profile(fdl::cuda::CudaModel& m, const char* what, int B, double per) {
  const auto p = m.profile();
  double total = 0;
  for (const auto& [k, v] : p) total += v;
  if (total == 0) return;
  std::printf("  profile batch %d %s (ms%s):", B, what, per > 1 ? " per step" : "");
  for (const auto& [k, v] : p) std::printf(" %s %.3f", k.c_str(), v / per);
  std::printf(" | total %.3f\n", total / per);
  m.reset_profile();
}

// How a decode step turns its rows into the next tokens.
enum class Mode { Argmax, FullLogits, DeviceSampling, HostSampling, DeviceGreedy, Pipelined, PipelinedSampling };
bool pipelined(Mode m) { return m == Mode::Pipelined || m == Mode::PipelinedSampling; }
const char* mode_label(Mode mode) {
  switch (mode) {
    case Mode::FullLogits: return " (full logits to host)";
    case Mode::DeviceSampling: return " (sampled on the GPU)";
    case Mode::HostSampling: return " (sampled on the host)";
    case Mode::DeviceGreedy: return " (greedy through forward_sample)";
    case Mode::Pipelined: return " (pipelined: greedy, next step queued before the ids return)";
    case Mode::PipelinedSampling: return " (pipelined, sampled on the GPU)";
    default: return "";
  }
}
const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::FullLogits: return "full_logits";
    case Mode::DeviceSampling: return "device_sampling";
    case Mode::HostSampling: return "host_sampling";
    case Mode::DeviceGreedy: return "device_greedy";
    case Mode::Pipelined: return "pipelined";
    case Mode::PipelinedSampling: return "pipelined_sampling";
    default: return "argmax";
  }
}
// llama.cpp's default sampler settings.
fdl::SamplingParams bench_sampling(uint64_t seed) {
  fdl::SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 40;
  p.top_p = 0.95f;
  p.min_p = 0.05f;
  p.seed = seed;
  return p;
}

// Device-to-device copy bandwidth in TB/s (bytes read + bytes written per second).
double measure_copy_bandwidth() {
  const size_t bytes = size_t(4) << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess) return 0;
  if (cudaMalloc(&b, bytes) != cudaSuccess) {
    cudaFree(a);
    return 0;
  }
  cudaMemset(a, 1, bytes);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> tb_s;
  for (int i = 0; i < 10; ++i) {
    cudaEventRecord(e0);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms_copy = 0;
    cudaEventElapsedTime(&ms_copy, e0, e1);
    if (i > 0) tb_s.push_back(2.0 * double(bytes) / (double(ms_copy) / 1e3) / 1e12);  // the first warms up
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  return median(tb_s);
}

RunResult run_once(fdl::cuda::CudaModel& m, fdl::KvCache& kv, const std::vector<std::vector<int32_t>>& prompts,
                   int gen, Mode mode, bool show_profile = false) {
  RunResult r;
  const int B = int(prompts.size());
  const fdl::ModelConfig& c = m.config();
  std::vector<fdl::SeqId> seqs;
  std::vector<int32_t> next(static_cast<size_t>(B)), ids;
  std::vector<float> logits;
  std::vector<fdl::Sampler> samplers;
  for (int s = 0; s < B; ++s) samplers.emplace_back(bench_sampling(uint64_t(s) + 1), c.n_vocab);
  std::vector<fdl::RowSampling> rows(static_cast<size_t>(B));
  fdl::StepBatch batch;
  const auto t0 = Clock::now();
  for (int s = 0; s < B; ++s) {
    seqs.push_back(kv.create_sequence());
    const size_t first = kv.append_slots(seqs.back(), prompts[size_t(s)].size());
    batch.clear();
    for (size_t i = 0; i < prompts[size_t(s)].size(); ++i)
      batch.add(prompts[size_t(s)][i], int32_t(first + i), seqs.back(), i + 1 == prompts[size_t(s)].size());
    m.forward_argmax(batch, kv, ids);
    next[size_t(s)] = ids[0];
    if (s == 0) {
      r.ttft_ms = ms(t0, Clock::now());
      if (show_profile) print_profile(m, "prefill of one prompt", B, 1);
    }
  }
  r.prefill_ms = ms(t0, Clock::now());
  if (show_profile && B > 1) print_profile(m, "prefill of the other prompts (per prompt)", B, B - 1);
  // K and V of one token in every layer, in the cache's element type (f32 or 16-bit).
  const fdl::KvShape kv_shape = m.kv_shape(16);
  const double kv_token_bytes = double(kv_shape.block_bytes()) / kv_shape.block_size;
  const auto d0 = Clock::now();
  auto last_collect = d0;  // pipelined modes
  for (int step = 0; step < gen; ++step) {
    const auto s0 = Clock::now();
    batch.clear();
    for (int s = 0; s < B; ++s) {
      const int32_t pos = int32_t(kv.append_slots(seqs[size_t(s)], 1));
      // Pipelined: sequence s sits in row s of every step, so its token is the id row s of
      // the step still in flight draws.
      const int32_t token = pipelined(mode) && step > 0 ? fdl::previous_step_id(s) : next[size_t(s)];
      batch.add(token, pos, seqs[size_t(s)], true);
      r.kv_bytes_read += double(pos + 1) * kv_token_bytes;
    }
    if (pipelined(mode)) {
      for (int s = 0; s < B; ++s)
        rows[size_t(s)] = mode == Mode::Pipelined ? fdl::RowSampling{}
                                                  : fdl::Sampler::row_sampling(samplers[size_t(s)].params(),
                                                                               samplers[size_t(s)].next_uniform());
      m.submit_sample(batch, kv, rows, {});
      if (step > 0) {  // the previous step's ids, while this one runs
        m.collect_ids(ids);
        std::copy(ids.begin(), ids.end(), next.begin());
        // A step's time: from one collect to the next (the first includes the first submit).
        r.steps.push_back(ms(last_collect, Clock::now()));
        last_collect = Clock::now();
      }
      continue;
    } else if (mode == Mode::FullLogits || mode == Mode::HostSampling) {
      m.forward(batch, kv, logits);
      for (int s = 0; s < B; ++s) {
        const float* row = logits.data() + size_t(s) * size_t(c.n_vocab);
        next[size_t(s)] = mode == Mode::HostSampling
                              ? samplers[size_t(s)].sample({row, size_t(c.n_vocab)})
                              : int32_t(std::max_element(row, row + c.n_vocab) - row);
      }
    } else if (mode == Mode::DeviceSampling || mode == Mode::DeviceGreedy) {
      for (int s = 0; s < B; ++s)
        rows[size_t(s)] = mode == Mode::DeviceGreedy ? fdl::RowSampling{}
                                                     : fdl::Sampler::row_sampling(samplers[size_t(s)].params(),
                                                                                  samplers[size_t(s)].next_uniform());
      m.forward_sample(batch, kv, rows, {}, ids);
      std::copy(ids.begin(), ids.end(), next.begin());
    } else {
      m.forward_argmax(batch, kv, ids);
      std::copy(ids.begin(), ids.end(), next.begin());
    }
    r.steps.push_back(ms(s0, Clock::now()));
  }
  if (pipelined(mode)) {
    m.collect_ids(ids);
    std::copy(ids.begin(), ids.end(), next.begin());
    r.steps.push_back(ms(last_collect, Clock::now()));
  }
  r.decode_ms = ms(d0, Clock::now());
  if (show_profile) print_profile(m, "decode", B, gen);
  for (fdl::SeqId s : seqs) kv.free_sequence(s);
  return r;
}

// --trace: where the time of a batch-1 layer goes, from the persistent kernels' phase stamps
// of the last decode step (FLASHDLLM_DECODE_TRACE=1). Per layer 1..L-1, each event's earliest,
// median and latest block, in µs after the moment the previous kernel's last block ended;
// medians over the layers.
void print_trace(const fdl::cuda::CudaModel& m) {
  const auto t = m.decode_trace();
  if (t.n_layer < 2 || t.attn_blocks == 0 || t.ffn_blocks == 0) {
    std::printf("  trace: none (the persistent batch-1 kernels did not run)\n");
    return;
  }
  auto ev = [](const std::vector<uint64_t>& v, int l, int e, int events, int blocks) {
    const uint64_t* p = v.data() + (size_t(l) * events + size_t(e)) * blocks;
    return std::vector<uint64_t>(p, p + blocks);
  };
  auto last_end = [&](bool ffn, int l) {
    const auto v = ffn ? ev(t.ffn, l, fdl::cuda::kFfnEnd, t.ffn_events, t.ffn_blocks)
                       : ev(t.attn, l, fdl::cuda::kAttnEnd, t.attn_events, t.attn_blocks);
    return double(*std::max_element(v.begin(), v.end()));
  };
  auto report = [&](const char* kernel, std::span<const char* const> names, bool ffn) {
    std::printf("  trace %s (µs after the previous kernel's last block; min / median / max over blocks):\n", kernel);
    for (size_t e = 0; e < names.size(); ++e) {
      std::vector<double> lo, mid, hi;
      for (int l = 1; l < t.n_layer; ++l) {
        const double ref = ffn ? last_end(false, l) : last_end(true, l - 1);
        auto v = ffn ? ev(t.ffn, l, int(e), t.ffn_events, t.ffn_blocks) : ev(t.attn, l, int(e), t.attn_events, t.attn_blocks);
        std::sort(v.begin(), v.end());
        lo.push_back((double(v.front()) - ref) / 1e3);
        mid.push_back((double(v[v.size() / 2]) - ref) / 1e3);
        hi.push_back((double(v.back()) - ref) / 1e3);
      }
      std::printf("    %-22s %8.2f %8.2f %8.2f\n", names[e], median(lo), median(mid), median(hi));
    }
  };
  // One name per event of kernels.h's AttnTraceEvent / FfnTraceEvent, in order.
  static constexpr const char* kAttnNames[] = {"entry", "after PDL wait", "norm done", "qkv done", "qkv handed off",
                                               "partial done", "partials handed off", "merge done", "out handed off",
                                               "end"};
  static constexpr const char* kFfnNames[] = {"entry", "after PDL wait", "norm done", "gate/up done", "h handed off", "end"};
  static_assert(std::size(kAttnNames) == fdl::cuda::kAttnTraceEvents && std::size(kFfnNames) == fdl::cuda::kFfnTraceEvents,
                "a trace event without a name (kernels.h)");
  report("attention block", kAttnNames, false);
  report("FFN block", kFfnNames, true);
  std::vector<double> attn_span, ffn_span;
  for (int l = 1; l < t.n_layer; ++l) {
    attn_span.push_back((last_end(false, l) - last_end(true, l - 1)) / 1e3);
    ffn_span.push_back((last_end(true, l) - last_end(false, l)) / 1e3);
  }
  const auto first = ev(t.attn, 0, fdl::cuda::kAttnEntry, t.attn_events, t.attn_blocks);
  std::printf("  trace: attention half %.2f µs, FFN half %.2f µs per layer (medians); layers 0..%d span %.3f ms\n",
              median(attn_span), median(ffn_span), t.n_layer - 1,
              (last_end(true, t.n_layer - 1) - double(*std::min_element(first.begin(), first.end()))) / 1e6);
}


}  // namespace

int main(int argc, char** argv) {
  std::string model_path, json_path, batches_s = "1,64";
  int prompt = 512, gen = 128, reps = 3, block_size = 16;
  bool sampling = false, trace = false, invariant = true;  // --batch-invariant: ModelOptions' default
  std::optional<fdl::KvDtype> kv_dtype;  // auto
  try {  // a malformed value (a number, a --kv-cache-dtype) is a usage error, not a crash
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "-m" || a == "--model") model_path = val();
    else if (a == "--prompt") prompt = std::stoi(val());
    else if (a == "--gen") gen = std::stoi(val());
    else if (a == "--batches") batches_s = val();
    else if (a == "--reps") reps = std::stoi(val());
    else if (a == "--block-size") block_size = std::stoi(val());
    else if (a == "--json") json_path = val();
    else if (a == "--sampling") sampling = true;
    else if (a == "--trace") trace = true;
    else if (a == "--kv-cache-dtype") kv_dtype = fdl::parse_kv_dtype(val());
    else if (a == "--batch-invariant") {
      const std::string v = val();
      if (v != "on" && v != "off") throw std::invalid_argument("--batch-invariant takes on or off, got " + v);
      invariant = v == "on";
    }
    else {
      std::fprintf(stderr, "bench_gpu: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu: %s\n", e.what());
    return 2;
  }
  if (model_path.empty() || prompt < 1 || gen < 1 || reps < 1) {
    std::fprintf(stderr, "usage: bench_gpu -m model.gguf [--prompt N] [--gen N] [--batches 1,64] [--reps N] [--sampling] [--trace] [--kv-cache-dtype T] [--batch-invariant on|off] [--json F]\n");
    return 2;
  }
  if (trace) setenv("FLASHDLLM_DECODE_TRACE", "1", 1);  // read when the model loads
  try {
    const auto tl = Clock::now();
    auto model = fdl::Model::load(model_path, fdl::ModelOptions{.device = fdl::Device::Cuda, .kv_dtype = kv_dtype, .batch_invariant = invariant});
    const double load_ms = ms(tl, Clock::now());
    auto& m = dynamic_cast<fdl::cuda::CudaModel&>(*model);
    const fdl::ModelConfig& c = m.config();
    const char* kv_name = fdl::kv_dtype_name(m.kv_shape(block_size).dtype);
    std::printf("model %s: %d layers, dim %d, vocab %d; %.2f GB on the GPU, %.2f GB streamed per step; KV cache %s; "
                "load %.1f s; batch-invariant %s\n",
                model_path.c_str(), c.n_layer, c.n_embd, c.n_vocab, double(m.weight_bytes()) / 1e9,
                double(m.weight_bytes_per_step()) / 1e9, kv_name, load_ms / 1e3, m.batch_invariant() ? "on" : "off");
    nlohmann::json out = {{"model", model_path}, {"prompt", prompt}, {"gen", gen}, {"reps", reps}, {"kv_dtype", kv_name}, {"batch_invariant", m.batch_invariant()},
                          {"weight_bytes", m.weight_bytes()}, {"weight_bytes_per_step", m.weight_bytes_per_step()},
                          {"results", nlohmann::json::array()}};
    const double copy_bw = measure_copy_bandwidth();
    const double roofline = copy_bw * 1e12 / double(m.weight_bytes());
    std::printf("copy bandwidth %.3f TB/s (cudaMemcpy device to device, 4 GiB, read + write, median of 9): "
                "batch-1 roofline %.1f tok/s (%.2f GB of weights), 90%% of it %.1f tok/s\n",
                copy_bw, roofline, double(m.weight_bytes()) / 1e9, 0.9 * roofline);
    out["copy_bandwidth_tb_s"] = copy_bw;
    out["roofline_tok_s"] = roofline;
    std::mt19937_64 rng(42);
    std::uniform_int_distribution<int32_t> tok(1, c.n_vocab - 1);
    for (int B : parse_int_list(batches_s)) {
      std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(B));
      for (auto& p : prompts)
        for (int i = 0; i < prompt; ++i) p.push_back(tok(rng));
      const int per_seq = (prompt + gen + block_size) / block_size;
      fdl::BlockPool pool(m.kv_shape(block_size), size_t(B) * size_t(per_seq));
      fdl::KvCache kv(pool);
      std::vector<Mode> modes{Mode::Argmax, Mode::Pipelined};
      if (B == 1) modes.push_back(Mode::FullLogits);
      if (sampling)
        modes.insert(modes.end(), {Mode::DeviceSampling, Mode::HostSampling, Mode::DeviceGreedy, Mode::PipelinedSampling});
      for (const Mode mode : modes) {
        for (int w = 0; w < 2; ++w) run_once(m, kv, prompts, std::min(gen, 4), mode);  // warm-up
        std::vector<double> tps, ttft, prefill, sigma, step_med, bw;
        for (int r = 0; r < reps; ++r) {
          m.reset_profile();
          const RunResult rr = run_once(m, kv, prompts, gen, mode, r == 0);
          tps.push_back(double(B) * gen / (rr.decode_ms / 1e3));
          ttft.push_back(rr.ttft_ms);
          prefill.push_back(rr.prefill_ms);
          sigma.push_back(stddev(rr.steps));
          const double med = median(rr.steps);
          step_med.push_back(med);
          const double bytes = double(m.weight_bytes_per_step()) + rr.kv_bytes_read / gen;
          bw.push_back(bytes / (med / 1e3) / 1e12);
        }
        const double bw_med = median(bw);
        std::printf("batch %2d%s: decode %.1f tok/s (step median %.3f ms, sigma %.3f ms), TTFT %.2f ms, "
                    "prefill of %d x %d tokens %.1f ms, HBM %.2f TB/s = %.0f%% of 4.26, %.1f%% of the measured %.3f",
                    B, mode_label(mode), median(tps), median(step_med), median(sigma),
                    median(ttft), B, prompt, median(prefill), bw_med, 100 * bw_med / 4.26, 100 * bw_med / copy_bw,
                    copy_bw);
        if (B == 1) std::printf("; %.1f%% of the roofline", 100 * median(tps) / roofline);
        std::printf("\n");
        if (trace && B == 1 && mode == Mode::Argmax) print_trace(m);
        out["results"].push_back({{"batch", B}, {"full_logits", mode == Mode::FullLogits}, {"mode", mode_name(mode)},
                                  {"decode_tok_s", median(tps)},
                                  {"step_ms_median", median(step_med)}, {"step_sigma_ms", median(sigma)},
                                  {"ttft_ms", median(ttft)}, {"prefill_ms", median(prefill)},
                                  {"hbm_tb_s", bw_med}, {"decode_tok_s_all", tps}});
      }
    }
    if (!json_path.empty()) std::ofstream(json_path) << out.dump(1) << "\n";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu: %s\n", e.what());
    return 1;
  }
  return 0;
}
