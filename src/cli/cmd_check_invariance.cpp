// `flashdllm tools check-invariance` — runs one set of prompts through the engine under
// several schedules and checks that every sequence gets the same tokens under each: alone,
// all together, in staggered waves, with prompts prefilled in small chunks, with speculative
// decoding, and again from the prefix cache. With `--batch-invariant on` (and on the CPU,
// always) they must all agree bit for bit; with `off` on a GPU they usually do not, and the
// report shows where they part. Token ids are random (seeded), EOS is ignored, decoding is
// greedy or, with --sampling, seeded sampling (temperature 0.8; request i has seed S + i).
// Prints one line per schedule (or one JSON object with --json); exit status 1 when any
// sequence differs from its run alone.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cli/cli_error.h"
#include "cli/commands.h"
#include "cli/json_output.h"
#include "cli/model_flags.h"
#include "cli/model_path.h"
#include "cli/option_checks.h"
#include "cli/stdout_io.h"
#include "flashdllm/engine.h"
#include "flashdllm/speculative.h"

namespace fdl::cli {
namespace {

using Clock = std::chrono::steady_clock;
using Ids = std::vector<std::vector<int32_t>>;

struct CheckOptions {
  std::string model;
  int threads = 0;
  bool mmap = false;
  int prompts = 64;
  int min_len = 16;
  int max_len = 1500;
  bool max_len_given = false;  // --max-len on the command line; else the default, shrunk to the model's context
  int n_predict = 128;
  int wave = 7;
  int small_chunk = 64;
  int mid_chunk = 256;
  int block_size = 16;
  std::string seed_text = "42";  // --seed, parsed by run_check (0..2^64-1)
  uint64_t seed = 42;
  bool sampling = false;
  bool json = false;
};

// Prompt lengths from min_len to max_len (both taken), the others uniform between; ids random
// after a BOS.
Ids make_prompts(const CheckOptions& o, const Tokenizer& tok) {
  std::mt19937_64 rng(o.seed);
  const int32_t vocab = std::min<int32_t>(tok.n_vocab(), 32000);
  std::uniform_int_distribution<int32_t> id(3, std::max<int32_t>(4, vocab - 1));
  std::uniform_int_distribution<int> len(o.min_len, o.max_len);
  Ids prompts(size_t(o.prompts));
  for (int i = 0; i < o.prompts; ++i) {
    const int n = i == 0 ? o.min_len : i == o.prompts - 1 ? o.max_len : len(rng);
    auto& p = prompts[size_t(i)];
    p.push_back(tok.bos_id() >= 0 ? tok.bos_id() : 1);
    while (int(p.size()) < n) p.push_back(id(rng));
  }
  return prompts;
}

// One schedule: how the engine is configured and how the requests arrive.
struct Schedule {
  std::string name;
  std::string what;
  int max_num_seqs = 0;            // 0: all prompts at once
  int budget = 0;                  // max_num_batched_tokens; 0: room for the longest prompt and every decode
  int max_prefill_tokens = 0;
  bool spec = false;
  int wave = 0;                    // > 0: submit this many, wait for their first tokens, then the next
  bool twice = false;              // run everything, then again on the same engine (the prefix cache hit)
};

struct ScheduleResult {
  Ids ids;                    // generated ids per prompt (of the last pass)
  int64_t cached_tokens = 0;  // prompt tokens of the last pass served from the prefix cache
};

// Runs every prompt under schedule `s`.
ScheduleResult run_schedule(Model& model, const Tokenizer& tok, const CheckOptions& o, const Ids& prompts, const Schedule& s,
                 int n_ctx) {
  const int n = int(prompts.size());
  EngineOptions eo;
  eo.generator.block_size = o.block_size;
  eo.generator.n_ctx = n_ctx;
  eo.generator.max_sequences = s.max_num_seqs > 0 ? s.max_num_seqs : n;
  if (s.spec) eo.generator.spec.mode = SpecMode::Auto;
  eo.scheduler.length_buckets = false;  // a prompt takes what the budget leaves, whatever its length
  eo.scheduler.max_num_batched_tokens =
      s.budget > 0 ? s.budget + eo.generator.max_sequences : o.max_len + eo.generator.max_sequences;
  eo.scheduler.max_prefill_tokens = s.max_prefill_tokens;
  eo.scheduler.prefix_cache = s.twice;
  // What the sinks touch is declared before the engine, so it outlives the engine's thread
  // (the engine is destroyed first, aborting and joining) on every way out of here.
  ScheduleResult res;
  Ids& out = res.ids;
  out.resize(size_t(n));
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0, started = 0;  // started: requests with a first token, or finished without one
  std::string failure;
  std::optional<Engine> made;
  try {
    made.emplace(model, tok, eo);
  } catch (const std::invalid_argument& e) {
    throw CliError(e.what());
  }
  Engine& engine = *made;

  auto submit = [&](int i) {
    GenerationRequest r;
    r.prompt_ids = prompts[size_t(i)];
    r.max_new_tokens = o.n_predict;
    r.ignore_eos = true;
    if (o.sampling) {
      r.sampling.temperature = 0.8f;
      r.sampling.seed = o.seed + uint64_t(i);  // wraps at 2^64, as a seed may
    } else {
      r.sampling.temperature = 0.f;
    }
    out[size_t(i)].clear();
    auto sink = [&, i, first = true](const RequestOutput& d) mutable {
      std::lock_guard lk(mu);
      for (const auto& t : d.tokens) out[size_t(i)].push_back(t.id);
      if (first && (!d.tokens.empty() || d.finished)) first = false, ++started;
      if (d.finished) {
        if (d.finish_reason != "length" && failure.empty())
          failure = "prompt " + std::to_string(i) + " ended with '" + d.finish_reason + "': " + d.error;
        res.cached_tokens += d.cached_prompt_tokens;
        ++finished;
      }
      cv.notify_all();
    };
    try {
      engine.submit(std::move(r), std::move(sink));
    } catch (const std::invalid_argument& e) {
      throw CliError("check-invariance: prompt " + std::to_string(i) + ": " + e.what());
    }
  };
  auto wait_until = [&](const std::function<bool()>& done) {
    std::unique_lock lk(mu);
    cv.wait(lk, done);
  };
  for (int pass = 0; pass < (s.twice ? 2 : 1); ++pass) {
    finished = started = 0;
    res.cached_tokens = 0;
    if (s.max_num_seqs == 1) {  // alone: one request in the engine at a time
      for (int i = 0; i < n; ++i) {
        submit(i);
        wait_until([&] { return finished == i + 1; });
      }
    } else if (s.wave > 0) {
      for (int i = 0; i < n; i += s.wave) {
        const int end = std::min(n, i + s.wave);
        for (int j = i; j < end; ++j) submit(j);
        wait_until([&] { return started >= end; });
      }
    } else {
      for (int i = 0; i < n; ++i) submit(i);
    }
    wait_until([&] { return finished == n; });
    if (!failure.empty()) throw CliError("check-invariance: schedule " + s.name + ": " + failure);
  }
  return res;
}

void run_check(CheckOptions o) {
  o.seed = *parse_seed("--seed", o.seed_text, /*allow_random=*/false);
  check_int_in("--prompts", o.prompts, 1, 4096);
  check_int_in("--min-len", o.min_len, 1, 1 << 20);
  check_int_in("--max-len", o.max_len, 1, 1 << 20);
  if (o.max_len < o.min_len)
    throw CliError("--max-len (" + std::to_string(o.max_len) + ") is below --min-len (" + std::to_string(o.min_len) +
                   ")");
  check_int_in("-n/--n-predict", o.n_predict, 1, 1 << 20);
  check_int_in("--wave", o.wave, 1, 4096);
  check_int_in("--small-chunk", o.small_chunk, 1, 1 << 20);
  check_int_in("--mid-chunk", o.mid_chunk, 1, 1 << 20);
  if (o.mid_chunk == o.small_chunk)
    throw CliError("--mid-chunk and --small-chunk are both " + std::to_string(o.small_chunk) +
                   ": give two sizes (the two chunked schedules would be the same)");
  check_int_in("--block-size", o.block_size, 1, kMaxBlockSize);
  check_int_in("-t/--threads", o.threads, 0, kMaxThreads);
  // The context the longest prompt and its tokens need, in whole blocks.
  auto context_for = [&](int max_len) { return (max_len + o.n_predict + o.block_size - 1) / o.block_size * o.block_size; };
  int n_ctx = context_for(o.max_len);
  const auto path = resolve_model_path(o.model);
  LoadedModel loaded = load_model(path, model_options(o.threads, o.mmap, n_ctx));
  const int n_ctx_train = loaded.model->config().n_ctx_train;
  // The default longest prompt is cut to what the model's context holds beside -n (in whole
  // blocks); a --max-len given on the command line is kept, and refused below if it does not fit.
  if (!o.max_len_given && n_ctx_train > 0 && n_ctx > n_ctx_train) {
    const int fits = (n_ctx_train / o.block_size) * o.block_size - o.n_predict;
    if (fits >= o.min_len) o.max_len = std::min(o.max_len, fits), n_ctx = context_for(o.max_len);
  }
  const int needed = o.max_len + o.n_predict;
  if (n_ctx_train > 0 && n_ctx > n_ctx_train)
    throw CliError("--max-len + --n-predict need a context of " + std::to_string(needed) + " tokens (" +
                   std::to_string(n_ctx) + " in whole blocks of --block-size " + std::to_string(o.block_size) +
                   "); the model has " + std::to_string(n_ctx_train));
  const Ids prompts = make_prompts(o, *loaded.tokenizer);

  const std::string small = std::to_string(o.small_chunk), mid = std::to_string(o.mid_chunk);
  const std::vector<Schedule> schedules = {
      {"alone", "each prompt alone, prefilled whole", 1},
      {"together", "all prompts at once", 0, 1 << 14},
      {"waves", "waves of " + std::to_string(o.wave) + ", each after the last one's first tokens", 0, 1 << 14, 0,
       false, o.wave},
      {"chunk-" + small, "all at once, prompts prefilled " + small + " tokens per step", 0, o.small_chunk,
       o.small_chunk},
      {"chunk-" + mid, "all at once, prompts prefilled " + mid + " tokens per step", 0, o.mid_chunk, o.mid_chunk},
      {"spec", "all at once, speculative decoding (--spec auto)", 0, 1 << 14, 0, true},
      {"cached", "all at once, then again from the prefix cache", 0, 1 << 14, 0, false, 0, true},
  };
  Ids reference;
  nlohmann::json report = {{"model", path.filename().string()},
                           {"prompts", o.prompts},
                           {"prompt_lengths", {o.min_len, o.max_len}},
                           {"n_predict", o.n_predict},
                           {"seed", o.seed},
                           {"block_size", o.block_size},
                           {"wave", o.wave},
                           {"chunks", {o.small_chunk, o.mid_chunk}},
                           {"decoding", o.sampling ? "sampling" : "greedy"},
                           {"device", detail::device_flag()},
                           {"batch_invariant", loaded.model->batch_invariant()},
                           {"schedules", nlohmann::json::array()}};
  if (!o.json)
    std::printf("check-invariance: %d prompts of %d..%d tokens, %d new tokens each, %s; device %s, batch-invariant %s\n",
                o.prompts, o.min_len, o.max_len, o.n_predict, o.sampling ? "seeded sampling" : "greedy",
                detail::device_flag().c_str(), loaded.model->batch_invariant() ? "on" : "off");
  flush_stdout();
  int differing_total = 0;
  for (const Schedule& s : schedules) {
    const auto t0 = Clock::now();
    const ScheduleResult r = run_schedule(*loaded.model, *loaded.tokenizer, o, prompts, s, n_ctx);
    const Ids& ids = r.ids;
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    nlohmann::json row = {{"name", s.name}, {"what", s.what}, {"seconds", sec}, {"cached_prompt_tokens", r.cached_tokens}};
    if (reference.empty()) {
      reference = ids;
      row["reference"] = true;
      if (!o.json) std::printf("  %-10s reference (%s), %.1f s\n", s.name.c_str(), s.what.c_str(), sec);
    } else {
      int same = 0, first_prompt = -1, first_pos = -1;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] == reference[i]) {
          ++same;
          continue;
        }
        if (first_prompt < 0) {
          first_prompt = int(i);
          const auto m = std::mismatch(ids[i].begin(), ids[i].end(), reference[i].begin(), reference[i].end());
          first_pos = int(m.first - ids[i].begin());
        }
      }
      differing_total += int(ids.size()) - same;
      row["identical"] = same;
      if (first_prompt >= 0) row["first_difference"] = {{"prompt", first_prompt}, {"token", first_pos}};
      if (!o.json) {
        std::printf("  %-10s %d/%d identical (%s), %.1f s", s.name.c_str(), same, int(ids.size()), s.what.c_str(),
                    sec);
        if (s.twice) std::printf("; %lld prompt tokens from the cache", static_cast<long long>(r.cached_tokens));
        if (first_prompt >= 0) std::printf("; first difference: prompt %d, token %d", first_prompt, first_pos);
        std::printf("\n");
      }
    }
    report["schedules"].push_back(row);
    flush_stdout();  // a failed write stops the run here, not after the remaining schedules
  }
  report["differing"] = differing_total;
  if (o.json) print_json_line(report);
  if (differing_total > 0)
    throw CliError("check-invariance: " + std::to_string(differing_total) +
                   " sequences differ from their run alone (over all schedules)");
}

}  // namespace

void add_check_invariance_command(CLI::App& tools_app) {
  auto o = std::make_shared<CheckOptions>();
  CLI::App* cmd = tools_app.add_subcommand(
      "check-invariance",
      "Check that every sequence gets the same tokens alone, batched, in waves, chunked, speculated and cached");
  cmd->add_option("-m,--model", o->model, "GGUF file or Hugging Face model directory (default: $FLASHDLLM_MODEL or stories260K)");
  cmd->add_option("-t,--threads", o->threads, "Worker threads (0 = all cores)")->capture_default_str();
  cmd->add_option("--prompts", o->prompts, "Prompts (random token ids)")->capture_default_str();
  cmd->add_option("--min-len", o->min_len, "Shortest prompt (tokens, BOS included)")->capture_default_str();
  CLI::Option* max_len = cmd->add_option("--max-len", o->max_len,
                                         "Longest prompt (tokens; the default is cut to what the model's context holds "
                                         "beside -n)")
                             ->capture_default_str();
  cmd->add_option("-n,--n-predict", o->n_predict, "Tokens generated per prompt")->capture_default_str();
  cmd->add_option("--wave", o->wave, "Requests per wave of the staggered schedule")->capture_default_str();
  cmd->add_option("--small-chunk", o->small_chunk, "Prompt tokens per step of the first chunked schedule")
      ->capture_default_str();
  cmd->add_option("--mid-chunk", o->mid_chunk, "Prompt tokens per step of the second chunked schedule")
      ->capture_default_str();
  cmd->add_option("--block-size", o->block_size, "KV block size in tokens")->capture_default_str();
  cmd->add_option("--seed", o->seed_text, "Seed of the prompts and of the samplers (0..2^64-1)")->capture_default_str();
  cmd->add_flag("--sampling", o->sampling, "Seeded sampling (temperature 0.8) instead of greedy decoding");
  cmd->add_flag("--json", o->json, "Print one JSON object instead of the table");
  add_mmap_flag(cmd, o->mmap);  // also --device, --kv-cache-dtype, --batch-invariant
  cmd->callback([o, max_len] {
    o->max_len_given = max_len->count() > 0;
    run_check(*o);
  });
}

}  // namespace fdl::cli
