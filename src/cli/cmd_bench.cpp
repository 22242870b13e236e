// `flashdllm bench` — prefill and decode throughput in the spirit of llama-bench.
//
// Method (docs/BENCHMARKS.md): the prompt is `-p` token ids drawn uniformly from the vocab
// with std::mt19937_64(--seed, default 42), identical in every repetition. One warm-up run
// (full prefill + one decode step: pages the weights in, sizes scratch buffers) is not
// recorded. Each of `-r` repetitions then uses a fresh sequence in the paged KV cache:
//   pp: one forward over all prompt tokens (logits for the last one only) + greedy sample;
//   tg: `-n` single-token forwards, each fed the previous greedy token (EOS ignored).
// pp tok/s = p / prefill time; tg tok/s = n / total decode time; TTFT = prefill time
// (prompt in, first token out); inter-token latency = each decode step's wall time.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cli/model_flags.h"
#include "cli/bench_stats.h"
#include "cli/cli_error.h"
#include "cli/commands.h"
#include "cli/json_output.h"
#include "cli/model_path.h"
#include "cli/option_checks.h"
#include "cli/spec_flags.h"
#include "flashdllm/generator.h"
#include "flashdllm/kv_cache.h"
#include "flashdllm/model.h"
#include "flashdllm/sampling.h"

namespace fdl::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string model;
  int n_prompt = 128;
  int n_gen = 128;
  int repetitions = 5;
  int threads = 0;
  int block_size = 16;
  uint64_t seed = 42;
  std::string seed_text = "42";  // --seed as given (parsed into `seed`, range-checked)
  bool json = false;
  bool mmap = false;  // --mmap: zero-copy weights (GgufBacking::Mmap)
  std::string spec = "off";  // --spec: also measure generator decode with speculation
  int spec_window = 5;
  std::string spec_tree = "off";  // --spec-tree on|off
};

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct RunTimings {
  double prefill_ms = 0;
  std::vector<double> step_ms;  // one per decode step
};

class BenchRunner {
 public:
  BenchRunner(Model& model, const BenchOptions& opt)
      : model_(model),
        pool_(model.kv_shape(opt.block_size),
              static_cast<size_t>((opt.n_prompt + opt.n_gen + opt.block_size) / opt.block_size)),
        kv_(pool_),
        sampler_(SamplingParams{.temperature = 0.0f}, model.config().n_vocab) {}

  /// Prefill `prompt`, then `n_gen` greedy decode steps, in a fresh sequence.
  RunTimings run(const std::vector<int32_t>& prompt, int n_gen) {
    RunTimings t;
    const SeqId seq = kv_.create_sequence();
    StepBatch batch;
    for (size_t i = 0; i < prompt.size(); ++i) {
      batch.add(prompt[i], static_cast<int32_t>(i), seq, i + 1 == prompt.size());
    }
    auto t0 = Clock::now();
    kv_.append_slots(seq, prompt.size());
    model_.forward(batch, kv_, logits_);
    int32_t token = sampler_.sample(logits_);
    t.prefill_ms = ms_since(t0);

    for (int step = 0; step < n_gen; ++step) {
      const auto pos = static_cast<int32_t>(prompt.size()) + step;
      batch.clear();
      batch.add(token, pos, seq, true);
      t0 = Clock::now();
      kv_.append_slots(seq, 1);
      model_.forward(batch, kv_, logits_);
      token = sampler_.sample(logits_);
      t.step_ms.push_back(ms_since(t0));
    }
    kv_.free_sequence(seq);
    return t;
  }

 private:
  Model& model_;
  BlockPool pool_;
  KvCache kv_;
  Sampler sampler_;
  std::vector<float> logits_;
};

std::vector<int32_t> random_prompt(int n, int n_vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, n_vocab - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = pick(rng);
  return ids;
}

nlohmann::json summary_json(const SampleSummary& s) {
  return {{"mean", s.mean}, {"stddev", s.stddev}, {"median", s.median},
          {"p95", s.p95},   {"min", s.min},       {"max", s.max}};
}

void print_table(const nlohmann::json& j) {
  const auto row = [&](const char* test, const nlohmann::json& tps) {
    std::printf("| %-24s | %9.2f M | %7d | %-6s | %10.2f ± %-8.2f |\n",
                j["model_name"].get<std::string>().c_str(), j["n_params"].get<double>() / 1e6,
                j["n_threads"].get<int>(), test, tps["mean"].get<double>(),
                tps["stddev"].get<double>());
  };
  std::printf("| %-24s | %11s | %7s | %-6s | %21s |\n", "model", "params", "threads", "test", "t/s");
  std::printf("|%s|%s|%s|%s|%s|\n", std::string(26, '-').c_str(), std::string(13, '-').c_str(),
              std::string(9, '-').c_str(), std::string(8, '-').c_str(), std::string(23, '-').c_str());
  row(("pp" + std::to_string(j["n_prompt"].get<int>())).c_str(), j["pp_tok_s"]);
  if (!j["tg_tok_s"].is_null()) row(("tg" + std::to_string(j["n_gen"].get<int>())).c_str(), j["tg_tok_s"]);
  std::printf("\nload %.1f ms; TTFT %.2f ± %.2f ms", j["load_ms"].get<double>(),
              j["ttft_ms"]["mean"].get<double>(), j["ttft_ms"]["stddev"].get<double>());
  if (!j["itl_ms"].is_null()) {
    const auto& itl = j["itl_ms"];
    std::printf("; inter-token latency p50 %.3f ms, p95 %.3f ms, stddev %.3f ms",
                itl["median"].get<double>(), itl["p95"].get<double>(), itl["stddev"].get<double>());
  }
  std::printf(" (%d repetitions after 1 warm-up)\n", j["repetitions"].get<int>());
}

void check_options(const BenchOptions& opt) {
  // the upper bounds keep sizes far from int overflow; the model context is checked later
  check_int_in("-p/--n-prompt", opt.n_prompt, 1, 1 << 20);
  check_int_in("-n/--n-gen", opt.n_gen, 0, 1 << 20);
  check_int_in("-r/--repetitions", opt.repetitions, 1, 100000);
  check_int_in("-t/--threads", opt.threads, 0, kMaxThreads);
  check_int_in("--block-size", opt.block_size, 1, kMaxBlockSize);
  check_int_in("--spec-window", opt.spec_window, 0, 64);
}

// --spec: decode through the Generator (the engine's loop, where speculation lives), plain
// and speculative runs interleaved per repetition; tg tok/s = tokens after the first over
// the decode time, as GenerationTimings reports it.
void bench_speculation(const BenchOptions& opt, const std::vector<int32_t>& prompt,
                       nlohmann::json& j) {
  SpecOptions spec;
  try {
    spec.mode = parse_spec_mode(opt.spec);
  } catch (const std::invalid_argument& e) {
    throw CliError(std::string("--spec: ") + e.what());
  }
  spec.window = opt.spec_window;
  spec.tree = opt.spec_tree == "on";
  const int n_ctx = opt.n_prompt + opt.n_gen + 1;
  LoadedModel loaded = load_model(resolve_model_path(opt.model), model_options(opt.threads, opt.mmap, n_ctx));
  Generator plain(*loaded.model, *loaded.tokenizer,
                  GeneratorOptions{.block_size = opt.block_size, .n_ctx = n_ctx, .max_sequences = 1});
  Generator fast(*loaded.model, *loaded.tokenizer,
                 GeneratorOptions{.block_size = opt.block_size, .n_ctx = n_ctx, .max_sequences = 1,
                                  .spec = spec});
  GenerationRequest r;
  r.prompt_ids = prompt;
  r.sampling.temperature = 0.0f;
  r.max_new_tokens = opt.n_gen;
  r.ignore_eos = true;
  std::vector<double> plain_tps, spec_tps;
  for (int rep = 0; rep <= opt.repetitions; ++rep) {  // rep 0 is the warm-up
    const auto a = plain.generate({r}).at(0);
    const auto b = fast.generate({r}).at(0);
    if (a.generated_ids != b.generated_ids)
      throw std::logic_error("speculative decoding changed the greedy output");
    if (rep == 0) continue;
    plain_tps.push_back(a.timings.decode_tokens_per_s());
    spec_tps.push_back(b.timings.decode_tokens_per_s());
  }
  const SpecMetrics& m = fast.spec_metrics();
  j["spec"] = {{"mode", opt.spec},
               {"window", opt.spec_window},
               {"tree", opt.spec_tree},
               {"plain_tg_tok_s", summary_json(summarize(plain_tps))},
               {"spec_tg_tok_s", summary_json(summarize(spec_tps))},
               {"tokens_per_forward", m.tokens_per_forward()},
               {"mean_accepted_length", m.mean_accepted_length()},
               {"drafted", m.drafted},
               {"accepted", m.accepted},
               {"rejected", m.rejected},
               {"tree_steps", m.tree_steps},
               {"tree_alt_accepted", m.tree_alt_accepted},
               {"breaker_open", m.breaker_open}};
}

void run_bench(const BenchOptions& opt) {
  check_options(opt);
  const auto path = resolve_model_path(opt.model);
  const auto t_load = Clock::now();
  const int n_ctx = opt.n_prompt + opt.n_gen;
  const auto model = Model::load(path, model_options(opt.threads, opt.mmap, n_ctx));
  const double load_ms = ms_since(t_load);
  const ModelConfig& cfg = model->config();
  if (cfg.n_ctx_train > 0 && n_ctx > cfg.n_ctx_train) {
    throw CliError("-p + -n = " + std::to_string(n_ctx) + " tokens exceeds the model's context of " +
                   std::to_string(cfg.n_ctx_train));
  }

  const std::vector<int32_t> prompt = random_prompt(opt.n_prompt, cfg.n_vocab, opt.seed);
  BenchRunner runner(*model, opt);
  runner.run(prompt, opt.n_gen > 0 ? 1 : 0);  // warm-up, not recorded

  std::vector<double> pp_tps, tg_tps, ttft, itl;
  for (int r = 0; r < opt.repetitions; ++r) {
    const RunTimings t = runner.run(prompt, opt.n_gen);
    pp_tps.push_back(opt.n_prompt / (t.prefill_ms / 1e3));
    ttft.push_back(t.prefill_ms);
    if (opt.n_gen > 0) {
      double decode_ms = 0;
      for (const double s : t.step_ms) decode_ms += s;
      tg_tps.push_back(opt.n_gen / (decode_ms / 1e3));
      itl.insert(itl.end(), t.step_ms.begin(), t.step_ms.end());
    }
  }

  uint64_t n_params = 0;
  for (const GgufTensorInfo& ti : model->gguf().tensors()) n_params += ti.n_elements();
  nlohmann::json j = {
      {"model", path.string()},
      {"model_name", cfg.name.empty() ? path.filename().string() : cfg.name},
      {"n_params", n_params},
      {"n_threads", model->n_threads()},
      {"n_prompt", opt.n_prompt},
      {"n_gen", opt.n_gen},
      {"repetitions", opt.repetitions},
      {"seed", opt.seed},
      {"block_size", opt.block_size},
      {"load_ms", load_ms},
      {"pp_tok_s", summary_json(summarize(pp_tps))},
      {"pp_tok_s_samples", pp_tps},
      {"ttft_ms", summary_json(summarize(ttft))},
      {"ttft_ms_samples", ttft},
      {"prompt_token_ids", prompt},
  };
  if (opt.n_gen > 0) {
    j["tg_tok_s"] = summary_json(summarize(tg_tps));
    j["tg_tok_s_samples"] = tg_tps;
    j["itl_ms"] = summary_json(summarize(itl));
    j["itl_ms_samples"] = itl;  // every decode step of every repetition, in order
  } else {
    // -n 0: nothing decoded; the documented keys are present, with no statistics.
    j["tg_tok_s"] = nullptr;
    j["tg_tok_s_samples"] = nlohmann::json::array();
    j["itl_ms"] = nullptr;
    j["itl_ms_samples"] = nlohmann::json::array();
  }
  if (opt.spec != "off" && opt.n_gen > 0) bench_speculation(opt, prompt, j);
  if (opt.json) {
    print_json_line(j);
  } else {
    print_table(j);
    if (j.contains("spec")) {
      const auto& sp = j["spec"];
      std::printf("generator decode, plain %.2f tok/s vs --spec %s %.2f tok/s (medians); "
                  "tokens/forward %.2f, mean accepted length %.2f\n",
                  sp["plain_tg_tok_s"]["median"].get<double>(), opt.spec.c_str(),
                  sp["spec_tg_tok_s"]["median"].get<double>(), sp["tokens_per_forward"].get<double>(),
                  sp["mean_accepted_length"].get<double>());
    }
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto opt = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure prefill (pp) and decode (tg) throughput");
  cmd->add_option("-m,--model", opt->model, "GGUF file or Hugging Face model directory (default: $FLASHDLLM_MODEL or stories260K)");
  cmd->add_option("-p,--n-prompt", opt->n_prompt, "Prompt tokens to prefill")->capture_default_str();
  cmd->add_option("-n,--n-gen", opt->n_gen, "Tokens to decode one at a time")->capture_default_str();
  cmd->add_option("-r,--repetitions", opt->repetitions, "Measured repetitions (after one warm-up)")
      ->capture_default_str();
  cmd->add_option("-t,--threads", opt->threads, "Worker threads (0 = all cores)")->capture_default_str();
  cmd->add_option("--block-size", opt->block_size, "KV cache block size in tokens")->capture_default_str();
  cmd->add_option("--seed", opt->seed_text, "Seed of the random prompt token ids (0..2^64-1)")
      ->capture_default_str();
  cmd->add_flag("--json", opt->json, "Print one JSON object with all statistics");
  add_mmap_flag(cmd, opt->mmap);
  add_spec_flag(cmd, opt->spec, "Also measure generator decode plain vs speculative: off, lookup, lookahead, auto");
  cmd->add_option("--spec-window", opt->spec_window, "Max draft tokens per step with --spec")
      ->capture_default_str();
  add_spec_tree_flag(cmd, opt->spec_tree);
  cmd->callback([opt] {
    opt->seed = *parse_seed("--seed", opt->seed_text, /*allow_random=*/false);
    run_bench(*opt);
  });
}

}  // namespace fdl::cli
