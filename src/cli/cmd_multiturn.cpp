// `flashdllm multiturn` — a multi-turn chat workload on the Engine, for comparing KV tier
// placements (bench/bench_multiturn.py drives it). S sessions, T turns: turn t of every
// session is submitted together (the engine runs up to --max-num-seqs at once), and the next
// turn starts when all have finished. A returning turn's prompt is the previous prompt, the
// previous answer and a new message, so its leading full blocks are in the prefix cache — in
// tier 0 if they survived, in tier 1/2 if they were demoted, or gone (recomputed).
// Token ids are random (seeded) and decoding is greedy with EOS ignored, so every run of a
// configuration does the same work. Prints one JSON object on stdout.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cli/cli_error.h"
#include "cli/commands.h"
#include "cli/json_output.h"
#include "cli/kv_tier_flags.h"
#include "cli/model_flags.h"
#include "cli/model_path.h"
#include "cli/option_checks.h"
#include "flashdllm/engine.h"

namespace fdl::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct MultiturnOptions {
  std::string model;
  int threads = 0;
  bool mmap = false;
  int sessions = 32;
  int turns = 4;
  int first_tokens = 200;    // first prompt length
  int message_tokens = 32;   // new user message per returning turn
  int answer_tokens = 32;    // generated per turn
  int ctx_size = 0;          // 0 = what the workload needs, rounded up to a block
  int max_num_seqs = 4;
  int block_size = 16;
  uint32_t seed = 1;
  KvTierFlags kv;
  std::string trace;
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5));
  return v[i];
}

nlohmann::json stats_json(const std::vector<double>& v) {
  double sum = 0, sq = 0;
  for (double x : v) sum += x;
  const double mean = v.empty() ? 0 : sum / double(v.size());
  for (double x : v) sq += (x - mean) * (x - mean);
  return {{"n", v.size()},
          {"mean", mean},
          {"p50", percentile(v, 0.5)},
          {"p95", percentile(v, 0.95)},
          {"stddev", v.size() > 1 ? std::sqrt(sq / double(v.size() - 1)) : 0.0}};
}

void run_multiturn(const MultiturnOptions& o) {
  kv_logs_to_stderr();
  check_int_in("--sessions", o.sessions, 1, 100000);
  check_int_in("--turns", o.turns, 1, 1000);
  check_int_in("--first-tokens", o.first_tokens, 1, 1 << 20);
  check_int_in("--message-tokens", o.message_tokens, 1, 1 << 20);
  check_int_in("--answer-tokens", o.answer_tokens, 1, 1 << 20);
  check_int_in("--max-num-seqs", o.max_num_seqs, 1, 4096);
  check_int_in("--block-size", o.block_size, 1, kMaxBlockSize);
  check_int_in("-t/--threads", o.threads, 0, kMaxThreads);
  check_int_in("-c/--ctx-size", o.ctx_size, 0, 1 << 24);
  const int needed = o.first_tokens + (o.turns - 1) * (o.answer_tokens + o.message_tokens) +
                     o.answer_tokens;
  int n_ctx = o.ctx_size > 0 ? o.ctx_size : (needed + o.block_size - 1) / o.block_size * o.block_size;
  if (n_ctx < needed)
    throw CliError("-c/--ctx-size " + std::to_string(n_ctx) + " is below what the last turn needs (" +
                   std::to_string(needed) + " tokens)");

  const auto path = resolve_model_path(o.model);
  LoadedModel loaded = load_model(path, model_options(o.threads, o.mmap, n_ctx));
  const int n_ctx_train = loaded.model->config().n_ctx_train;
  if (n_ctx_train > 0 && n_ctx > n_ctx_train)
    throw CliError("the workload needs a context of " + std::to_string(n_ctx) +
                   " tokens; the model has " + std::to_string(n_ctx_train));

  EngineOptions eo;
  eo.generator.block_size = o.block_size;
  eo.generator.n_ctx = n_ctx;
  eo.generator.max_sequences = o.max_num_seqs;
  eo.generator.kv_tiers = kv_tier_options(o.kv);
  eo.generator.trace_file = o.trace;
  if (!o.trace.empty() && !std::ofstream(o.trace))  // the engine writes it only at the end
    throw CliError("--trace " + o.trace + ": cannot write this file");
  const size_t block_bytes = loaded.model->kv_shape(o.block_size).block_bytes();
  eo.kv_blocks = kv_tier0_blocks(o.kv, block_bytes, n_ctx, o.block_size,
                                 ctx_description(o.ctx_size, n_ctx, "the workload's context"));
  const auto t_setup = Clock::now();
  std::optional<Engine> made;
  try {
    made.emplace(*loaded.model, *loaded.tokenizer, eo);
  } catch (const std::invalid_argument& e) {
    throw CliError(e.what());
  }
  Engine& engine = *made;
  const double setup_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_setup).count();

  std::mt19937 rng(o.seed);
  const int32_t vocab = std::min<int32_t>(loaded.tokenizer->n_vocab(), 32000);
  std::uniform_int_distribution<int32_t> id(3, std::max<int32_t>(4, vocab - 1));
  auto random_ids = [&](int n) {
    std::vector<int32_t> v(static_cast<size_t>(n), 0);
    for (auto& t : v) t = id(rng);
    return v;
  };
  std::vector<std::vector<int32_t>> context(size_t(o.sessions));
  for (auto& c : context) {
    c = random_ids(o.first_tokens - 1);
    c.insert(c.begin(), loaded.tokenizer->bos_id() >= 0 ? loaded.tokenizer->bos_id() : 1);
  }

  std::vector<double> ttft_first, ttft_return;
  // Inter-token latency: the time between two deliveries of one request, per token of the
  // later one (a delivery of k tokens counts k gaps of a k-th of it).
  std::vector<double> itl;
  int64_t cached_return = 0, prompt_return = 0;
  const auto t0 = Clock::now();
  for (int turn = 0; turn < o.turns; ++turn) {
    if (turn > 0)
      for (auto& c : context) {
        const auto msg = random_ids(o.message_tokens);
        c.insert(c.end(), msg.begin(), msg.end());
      }
    std::mutex mu;
    std::condition_variable cv;
    int left = o.sessions;
    std::vector<RequestOutput> finals(size_t(o.sessions));
    std::vector<std::vector<int32_t>> answers(size_t(o.sessions));
    std::vector<std::optional<Clock::time_point>> last_delivery(size_t(o.sessions));
    for (int s = 0; s < o.sessions; ++s) {
      GenerationRequest r;
      r.prompt_ids = context[size_t(s)];
      r.sampling.temperature = 0.f;
      r.max_new_tokens = o.answer_tokens;
      r.ignore_eos = true;
      engine.submit(std::move(r), [&, s](const RequestOutput& out) {
        std::lock_guard lk(mu);
        for (const auto& t : out.tokens) answers[size_t(s)].push_back(t.id);
        if (!out.tokens.empty()) {
          const auto now = Clock::now();
          if (auto& last = last_delivery[size_t(s)]) {
            const double gap = std::chrono::duration<double, std::milli>(now - *last).count();
            for (size_t k = 0; k < out.tokens.size(); ++k) itl.push_back(gap / double(out.tokens.size()));
          }
          last_delivery[size_t(s)] = now;
        }
        if (out.finished) {
          finals[size_t(s)] = out;
          if (--left == 0) cv.notify_all();
        }
      });
    }
    {
      std::unique_lock lk(mu);
      cv.wait(lk, [&] { return left == 0; });
    }
    for (int s = 0; s < o.sessions; ++s) {
      const RequestOutput& f = finals[size_t(s)];
      if (f.finish_reason != "length")
        throw CliError("session " + std::to_string(s) + " turn " + std::to_string(turn) +
                       " ended with '" + f.finish_reason + "': " + f.error);
      (turn == 0 ? ttft_first : ttft_return).push_back(f.timings.ttft_ms);
      if (turn > 0) {
        cached_return += f.cached_prompt_tokens;
        prompt_return += f.prompt_tokens;
      }
      auto& c = context[size_t(s)];
      c.insert(c.end(), answers[size_t(s)].begin(), answers[size_t(s)].end());
    }
  }
  const double total_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  // Every session's final context (prompts and answers): runs that must agree — placements,
  // devices — compare this one value.
  XXH3_state_t* hs = XXH3_createState();
  XXH3_64bits_reset(hs);
  for (const auto& c : context) XXH3_64bits_update(hs, c.data(), c.size() * sizeof(int32_t));
  const uint64_t digest = XXH3_64bits_digest(hs);
  XXH3_freeState(hs);
  char digest_hex[17];
  std::snprintf(digest_hex, sizeof digest_hex, "%016llx", static_cast<unsigned long long>(digest));
  const EngineMetrics m = engine.metrics();
  nlohmann::json tiers = nlohmann::json::parse(m.kv_tiers.tiers.to_json());
  nlohmann::json out = {
      {"model", path.filename().string()},
      {"sessions", o.sessions},
      {"turns", o.turns},
      {"n_ctx", n_ctx},
      {"block_bytes", block_bytes},
      {"tier0_blocks", engine.options().kv_blocks},
      {"working_set_blocks", size_t(o.sessions) * size_t((needed + o.block_size - 1) / o.block_size)},
      {"placement", m.kv_tiers.placement},
      {"setup_ms", setup_ms},
      {"total_ms", total_ms},
      {"ttft_first_turn_ms", stats_json(ttft_first)},
      {"ttft_returning_ms", stats_json(ttft_return)},
      {"itl_ms", stats_json(itl)},
      {"output_tok_per_s", total_ms > 0 ? double(o.sessions) * o.turns * o.answer_tokens / (total_ms * 1e-3) : 0.0},
      {"returning_cached_fraction",
       prompt_return > 0 ? double(cached_return) / double(prompt_return) : 0.0},
      {"context_digest", digest_hex},
      {"prefill_tokens_computed", m.prefill_tokens_computed},
      {"preemptions", m.preemptions},
      {"forward_ms", m.forward_ms},
      {"kv_tiers",
       {{"enabled", m.kv_tiers.enabled},
        {"demoted_host", m.kv_tiers.demoted_host},
        {"demoted_disk", m.kv_tiers.demoted_disk},
        {"dropped", m.kv_tiers.dropped},
        {"promoted", m.kv_tiers.promoted},
        {"lost_tokens", m.kv_tiers.lost_tokens},
        {"prefetches", m.kv_tiers.prefetches},
        {"recompute_tok_per_s", m.kv_tiers.recompute_tok_per_s},
        {"disk_write_ms_per_block", m.kv_tiers.disk_write_ms_per_block},
        {"disk_read_ms_per_block", m.kv_tiers.disk_read_ms_per_block},
        {"copy_waits", m.kv_tiers.copy_waits},
        {"copy_wait_ms_total", m.kv_tiers.copy_wait_ms_total},
        {"copy_wait_ms_max", m.kv_tiers.copy_wait_ms_max},
        {"tiers", tiers}}}};
  if (!m.kv_tiers.profile.empty()) out["profile"] = nlohmann::json::parse(m.kv_tiers.profile);
  print_json_line(out);
}

}  // namespace

void add_multiturn_command(CLI::App& app) {
  auto o = std::make_shared<MultiturnOptions>();
  CLI::App* cmd = app.add_subcommand(
      "multiturn", "Multi-turn chat workload on the engine (KV tier benchmark; JSON on stdout)");
  cmd->add_option("-m,--model", o->model, "GGUF file or Hugging Face model directory (default: $FLASHDLLM_MODEL or stories260K)");
  cmd->add_option("-t,--threads", o->threads, "Worker threads (0 = all cores)")->capture_default_str();
  cmd->add_option("--sessions", o->sessions, "Chat sessions")->capture_default_str();
  cmd->add_option("--turns", o->turns, "Turns per session")->capture_default_str();
  cmd->add_option("--first-tokens", o->first_tokens, "First prompt length (tokens)")->capture_default_str();
  cmd->add_option("--message-tokens", o->message_tokens, "New message per returning turn (tokens)")
      ->capture_default_str();
  cmd->add_option("--answer-tokens", o->answer_tokens, "Tokens generated per turn")->capture_default_str();
  cmd->add_option("-c,--ctx-size", o->ctx_size, "Context size (0 = what the last turn needs)")
      ->capture_default_str();
  cmd->add_option("--max-num-seqs", o->max_num_seqs, "Sequences the engine runs at once")
      ->capture_default_str();
  cmd->add_option("--block-size", o->block_size, "KV block size in tokens")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the random token ids")->capture_default_str();
  cmd->add_option("--trace", o->trace, "Write a Chrome trace-event JSON of the run to this file");
  add_mmap_flag(cmd, o->mmap);  // also --device cpu|cuda
  add_kv_tier_flags(cmd, o->kv);
  cmd->callback([o] { run_multiturn(*o); });
}

}  // namespace fdl::cli
