// `flashdllm generate` — complete one prompt, streaming the text to stdout as it is made.
//
// Flags follow llama.cpp's llama-cli where they overlap. stdout carries only generated text
// (or, with --json, one JSON object), so the output can be piped; the timing summary goes to
// stderr.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cli/model_flags.h"
#include "cli/cli_error.h"
#include "cli/commands.h"
#include "cli/json_output.h"
#include "cli/kv_tier_flags.h"
#include "cli/model_path.h"
#include "cli/option_checks.h"
#include "cli/spec_flags.h"
#include "server/ordered_json_parser.h"
#include "cli/stdout_io.h"
#include "engine/resolved_options.h"
#include "flashdllm/generator.h"
#include "flashdllm/grammar.h"
#include "grammar/json_schema.h"
#include "model/sampling_defaults.h"

namespace fdl::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct GenerateOptions {
  bool no_async_scheduling = false;
  std::string model;
  std::string prompt;
  std::string prompt_file;
  int n_predict = 128;
  float temperature = 0.8f;
  int top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  int repeat_last_n = 64;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::string seed;  // "" = not given; "-1" = random; else unsigned decimal
  bool seed_given = false;
  // Sampling flags given on the command line; the others take the model's recommended
  // values (general.sampling.*, from generation_config.json) where it has them.
  bool temp_given = false, top_k_given = false, top_p_given = false, min_p_given = false, repeat_penalty_given = false;
  bool no_bos = false;
  bool parse_special = false;
  bool ignore_eos = false;
  std::vector<std::string> stop;
  int threads = 0;
  int block_size = 16;
  int ctx_size = 0;
  bool json = false;
  bool mmap = false;  // --mmap: zero-copy weights (GgufBacking::Mmap)
  std::string spec = "off";  // --spec off|lookup|lookahead|auto
  int spec_window = 5;
  std::string spec_tree = "off";  // --spec-tree on|off
  KvTierFlags kv;
  std::string trace;  // --trace FILE: Chrome trace-event JSON of the run
  std::string grammar, grammar_file;          // --grammar / --grammar-file: GBNF
  std::string json_schema, json_schema_file;  // -j,--json-schema / --json-schema-file
};

void check_options(const GenerateOptions& opt) {
  check_at_least("-n/--n-predict", opt.n_predict, -1);
  check_finite_in("--temp", opt.temperature, 0.0, 1e6);
  check_at_least("--top-k", opt.top_k, 0);
  check_finite_positive_upto("--top-p", opt.top_p, 1.0, "1 = off");
  check_finite_in("--min-p", opt.min_p, 0.0, 1.0);
  check_finite_positive_upto("--repeat-penalty", opt.repeat_penalty, 1e6, "1 = off");
  check_at_least("--repeat-last-n", opt.repeat_last_n, -1);
  check_finite("--presence-penalty", opt.presence_penalty);
  check_finite("--frequency-penalty", opt.frequency_penalty);
  check_int_in("-t/--threads", opt.threads, 0, kMaxThreads);
  check_int_in("--block-size", opt.block_size, 1, kMaxBlockSize);
  check_ctx_size("--ctx-size", opt.ctx_size);
  check_int_in("--spec-window", opt.spec_window, 0, 64);
  for (const auto& s : opt.stop) {
    if (s.empty()) throw CliError("--stop needs a non-empty string");
  }
}

SamplingParams sampling_from(const GenerateOptions& opt, uint64_t seed) {
  SamplingParams p;
  p.temperature = opt.temperature;
  p.top_k = opt.top_k;
  p.top_p = opt.top_p;
  p.min_p = opt.min_p;
  p.repeat_penalty = opt.repeat_penalty;
  p.repeat_last_n = opt.repeat_last_n;
  p.presence_penalty = opt.presence_penalty;
  p.frequency_penalty = opt.frequency_penalty;
  p.seed = seed;
  p.validate();
  return p;
}

std::string prompt_text(const GenerateOptions& opt) {
  if (opt.prompt_file.empty()) return opt.prompt;
  return read_text_file("-f", opt.prompt_file);
}

std::vector<int32_t> prompt_ids(const Tokenizer& tok, const std::string& text,
                                const GenerateOptions& opt) {
  if (!opt.no_bos) return encode_prompt(tok, text, opt.parse_special);  // "" -> [BOS]
  auto ids = tok.encode(text, /*add_special=*/false, opt.parse_special);
  if (ids.empty()) {
    throw CliError("the prompt is empty and --no-bos leaves no token to start from");
  }
  return ids;
}

// The grammar the flags ask for (at most one of them), compiled; null for none.
std::shared_ptr<const Grammar> grammar_from(const GenerateOptions& opt) {
  const int given = int(!opt.grammar.empty()) + int(!opt.grammar_file.empty()) + int(!opt.json_schema.empty()) +
                    int(!opt.json_schema_file.empty());
  if (given == 0) return nullptr;
  if (given > 1) throw CliError("give at most one of --grammar, --grammar-file, --json-schema, --json-schema-file");
  std::string flag = "--grammar";
  try {
    if (!opt.grammar.empty()) return Grammar::compile(opt.grammar);
    flag = "--grammar-file";
    if (!opt.grammar_file.empty()) return Grammar::compile(read_text_file("--grammar-file", opt.grammar_file));
    flag = !opt.json_schema.empty() ? "--json-schema" : "--json-schema-file";
    const std::string schema =
        !opt.json_schema.empty() ? opt.json_schema : read_text_file("--json-schema-file", opt.json_schema_file);
    std::string error;
    const nlohmann::ordered_json parsed = server::parse_ordered_json(schema, &error);  // properties in the schema's order
    if (parsed.is_discarded()) throw CliError(flag + ": not JSON: " + error);
    return Grammar::compile(grammar::json_schema_to_gbnf(parsed));
  } catch (const GrammarError& e) {
    throw CliError(flag + ": " + e.what());
  }
}

nlohmann::json spec_json(const SpecMetrics& m) {
  return {{"drafted", m.drafted},
          {"accepted", m.accepted},
          {"rejected", m.rejected},
          {"mean_accepted_length", m.mean_accepted_length()},
          {"tokens_per_forward", m.tokens_per_forward()},
          {"tree_steps", m.tree_steps},
          {"tree_alt_accepted", m.tree_alt_accepted},
          {"forced_drafted", m.forced_drafted},
          {"forced_accepted", m.forced_accepted},
          {"audited_steps", m.audited_steps},
          {"audit_mismatches", m.audit_mismatches},
          {"breaker_open", m.breaker_open},
          {"breaker_trips", m.breaker_trips}};
}

nlohmann::json kv_tiers_json(const KvTierMetrics& m) {
  nlohmann::json j = {{"enabled", m.enabled},
                      {"placement", m.placement},
                      {"demoted_host", m.demoted_host},
                      {"demoted_disk", m.demoted_disk},
                      {"dropped", m.dropped},
                      {"promoted", m.promoted},
                      {"failed_promotions", m.failed_promotions},
                      {"lost_tokens", m.lost_tokens},
                      {"prefetches", m.prefetches},
                      {"recompute_tok_per_s", m.recompute_tok_per_s},
                      {"tiers", nlohmann::json::parse(m.tiers.to_json())}};
  if (!m.profile.empty()) j["profile"] = nlohmann::json::parse(m.profile);
  return j;
}

nlohmann::json timings_json(const GenerationTimings& t, double load_ms) {
  return {{"load_ms", load_ms},
          {"prompt_tokens", t.prompt_tokens},
          {"prompt_ms", t.prompt_ms},
          {"prompt_tok_s", t.prompt_tokens_per_s()},
          {"ttft_ms", t.ttft_ms},
          {"gen_tokens", t.gen_tokens},
          {"decode_ms", t.decode_ms},
          {"decode_tok_s", t.decode_tokens_per_s()}};
}

void print_summary(const GenerationResult& r, double load_ms, uint64_t seed) {
  const GenerationTimings& t = r.timings;
  std::fprintf(stderr,
               "flashdllm: load %.1f ms | prompt %d tokens in %.2f ms (%.1f tok/s) | "
               "TTFT %.2f ms | generated %d tokens in %.2f ms (%.1f tok/s) | finish: %s | seed %llu\n",
               load_ms, t.prompt_tokens, t.prompt_ms, t.prompt_tokens_per_s(), t.ttft_ms,
               t.gen_tokens, t.decode_ms, t.decode_tokens_per_s(), r.finish_reason.c_str(),
               static_cast<unsigned long long>(seed));
}

void print_spec_summary(const SpecMetrics& m, const std::string& mode) {
  std::fprintf(stderr,
               "flashdllm: spec %s | drafted %lld accepted %lld rejected %lld | "
               "mean accepted length %.2f | tokens/forward %.2f | tree steps %lld (accepted off the "
               "first branch %lld) | audit mismatches %lld/%lld | breaker %s\n",
               mode.c_str(), static_cast<long long>(m.drafted), static_cast<long long>(m.accepted),
               static_cast<long long>(m.rejected), m.mean_accepted_length(), m.tokens_per_forward(),
               static_cast<long long>(m.tree_steps), static_cast<long long>(m.tree_alt_accepted),
               static_cast<long long>(m.audit_mismatches), static_cast<long long>(m.audited_steps),
               m.breaker_open ? "open" : "closed");
}

void run_generate(const GenerateOptions& opt) {
  kv_logs_to_stderr();
  check_options(opt);
  const std::optional<uint64_t> given =
      opt.seed_given ? parse_seed("--seed", opt.seed, /*allow_random=*/true) : std::nullopt;
  const uint64_t seed = given ? *given : std::random_device{}();
  GenerationRequest request;
  request.sampling = sampling_from(opt, seed);
  request.max_new_tokens = opt.n_predict;
  request.stop = opt.stop;
  request.ignore_eos = opt.ignore_eos;
  request.grammar = grammar_from(opt);
  const std::string text = prompt_text(opt);

  const auto path = resolve_model_path(opt.model);
  const auto t_load = Clock::now();
  LoadedModel loaded = load_model(path, model_options(opt.threads, opt.mmap, model_context(opt.ctx_size)));
  const double load_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_load).count();

  const int n_ctx_train = loaded.model->config().n_ctx_train;
  if (n_ctx_train > 0 && opt.ctx_size > n_ctx_train) {
    throw CliError("--ctx-size " + std::to_string(opt.ctx_size) + ": exceeds the model's context of " +
                   std::to_string(n_ctx_train) + " tokens");
  }
  request.prompt_ids = prompt_ids(*loaded.tokenizer, text, opt);
  // The model's recommended sampling settings for the flags not given (llama.cpp's behaviour).
  ModelSamplingDefaults model_defaults = model_sampling_defaults(loaded.model->gguf());
  if (opt.temp_given) model_defaults.temperature.reset();
  if (opt.top_k_given) model_defaults.top_k.reset();
  if (opt.top_p_given) model_defaults.top_p.reset();
  if (opt.min_p_given) model_defaults.min_p.reset();
  if (opt.repeat_penalty_given) model_defaults.repeat_penalty.reset();
  request.sampling = with_model_defaults(request.sampling, model_defaults);
  SpecOptions spec;
  try {
    spec.mode = parse_spec_mode(opt.spec);
  } catch (const std::invalid_argument& e) {
    throw CliError(std::string("--spec: ") + e.what());
  }
  spec.window = opt.spec_window;
  if (opt.spec_window == 0) request.spec_window = 0;  // no drafts at all, a grammar's forced ones included
  spec.tree = opt.spec_tree == "on";
  GeneratorOptions gopt{.block_size = opt.block_size,
                        .n_ctx = opt.ctx_size,
                        .max_sequences = 1,
                        .spec = spec};
  gopt.kv_tiers = kv_tier_options(opt.kv);
  gopt.trace_file = opt.trace;
  gopt.async_scheduling = !opt.no_async_scheduling;
  std::optional<Generator> made;
  try {
    // Checked against the context the Generator will use (the default when --ctx-size is 0),
    // so a too-small tier 0 is reported in the flag's own terms.
    const int pool_ctx = engine::resolve_options(*loaded.model, gopt).n_ctx;
    gopt.kv_blocks = kv_tier0_blocks(opt.kv, loaded.model->kv_shape(opt.block_size).block_bytes(), pool_ctx,
                                     opt.block_size, ctx_description(opt.ctx_size, pool_ctx));
    made.emplace(*loaded.model, *loaded.tokenizer, gopt);
  } catch (const std::invalid_argument& e) {
    throw CliError(e.what());  // e.g. a tier 0 too small for one context
  }
  Generator& generator = *made;
  const int n_ctx = generator.options().n_ctx;
  if (request.prompt_ids.size() >= size_t(n_ctx)) {
    throw CliError("prompt has " + std::to_string(request.prompt_ids.size()) +
                   " tokens but --ctx-size is " + std::to_string(n_ctx) +
                   (opt.ctx_size == 0 ? " (the default)" : "") +
                   ": no room for a new token; raise --ctx-size or shorten the prompt");
  }

  TextCallback stream;
  if (!opt.json) {
    stream = [](size_t, std::string_view piece) {
      // Show each piece as soon as it exists; a failed write (full disk, closed pipe) throws
      // out of generate() so generation stops at once.
      write_stdout(piece);
      flush_stdout();
    };
  }
  const GenerationResult result = generator.generate({request}, stream).at(0);

  const bool open_line = !result.text.empty() && result.text.back() != '\n';
  if (opt.json) {
    nlohmann::json out = {{"prompt_token_ids", result.prompt_ids},
                          {"token_ids", result.generated_ids},
                          {"text", result.text},
                          {"finish_reason", result.finish_reason},
                          {"matched_stop", result.matched_stop},
                          {"seed", seed},
                          {"timings", timings_json(result.timings, load_ms)},
                          {"spec", spec_json(generator.spec_metrics())}};
    const KvTierMetrics tiers = generator.tier_metrics();
    if (tiers.enabled) out["kv_tiers"] = kv_tiers_json(tiers);  // only with --kv-host-bytes / --kv-disk-bytes
    if (request.grammar) {
      const GeneratorStats& st = generator.last_stats();
      out["grammar"] = {{"rows", st.grammar_rows}, {"ms", st.grammar_ms}};
    }
    print_json_line(out);
  } else if (open_line && ::isatty(STDOUT_FILENO)) {
    write_stdout("\n");  // keep the shell prompt off the last line; pipes get exact text
  }
  flush_stdout();
  // The stats line goes to stderr; when the text did not end its line and stdout is not a
  // terminal, the line break goes to stderr too, so `2>&1` does not glue the two together.
  if (!opt.json && open_line && !::isatty(STDOUT_FILENO)) std::fputc('\n', stderr);
  print_summary(result, load_ms, seed);
  if (spec.mode != SpecMode::Off) print_spec_summary(generator.spec_metrics(), opt.spec);
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto opt = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand("generate", "Complete a prompt, streaming the text");
  cmd->add_option("-m,--model", opt->model, "GGUF file or Hugging Face model directory (default: $FLASHDLLM_MODEL or stories260K)");
  auto* prompt = cmd->add_option("-p,--prompt", opt->prompt, "Prompt text (\"\" = start from BOS)");
  auto* file = cmd->add_option("-f,--file", opt->prompt_file, "Read the prompt from this file");
  prompt->excludes(file);
  cmd->add_option("-n,--n-predict", opt->n_predict, "Tokens to generate (-1 = until EOS or context full)")
      ->capture_default_str();
  // Unset, these five take the model's recommended values where it has them.
  auto* temp = cmd->add_option("--temp", opt->temperature, "Temperature (0 = greedy; default: the model's, else this)")
                   ->capture_default_str();
  auto* top_k = cmd->add_option("--top-k", opt->top_k, "Top-k (0 = off; default: the model's, else this)")
                    ->capture_default_str();
  auto* top_p = cmd->add_option("--top-p", opt->top_p, "Top-p / nucleus (1 = off; default: the model's, else this)")
                    ->capture_default_str();
  auto* min_p = cmd->add_option("--min-p", opt->min_p, "Min-p (0 = off; default: the model's, else this)")
                    ->capture_default_str();
  auto* rep = cmd->add_option("--repeat-penalty", opt->repeat_penalty,
                              "Repetition penalty (1 = off; default: the model's, else this)")
                  ->capture_default_str();
  cmd->add_option("--repeat-last-n", opt->repeat_last_n, "Penalty window (-1 = whole context, 0 = off)")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", opt->presence_penalty, "Presence penalty (0 = off)")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", opt->frequency_penalty, "Frequency penalty (0 = off)")
      ->capture_default_str();
  auto* seed = cmd->add_option("-s,--seed", opt->seed,
                               "RNG seed 0..2^64-1, -1 = random (default: random, printed on stderr)");
  cmd->add_flag("--no-bos", opt->no_bos, "Do not add BOS (or EOS) to the prompt");
  cmd->add_flag("--parse-special", opt->parse_special, "Turn text such as <s> into special tokens");
  cmd->add_flag("--ignore-eos", opt->ignore_eos, "Keep generating past end-of-generation tokens");
  cmd->add_flag("--no-async-scheduling", opt->no_async_scheduling,
                "Wait for each decode step's tokens before queuing the next (GPU: async by default)");
  cmd->add_option("--stop", opt->stop, "Stop before this string (repeatable)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("-t,--threads", opt->threads, "Worker threads (0 = all cores)")->capture_default_str();
  cmd->add_option("--block-size", opt->block_size, "KV cache block size in tokens")->capture_default_str();
  cmd->add_option("-c,--ctx-size", opt->ctx_size, "Context size (0 = min(model context, 4096))")
      ->capture_default_str();
  // An empty value is refused rather than read as "no constraint".
  const CLI::Validator non_empty([](std::string& v) { return v.empty() ? std::string("must not be empty") : std::string(); },
                                 "");
  cmd->add_option("--grammar", opt->grammar, "Constrain the output to this GBNF grammar (start rule: root)")
      ->check(non_empty);
  cmd->add_option("--grammar-file", opt->grammar_file, "Read the GBNF grammar from this file")->check(non_empty);
  cmd->add_option("-j,--json-schema", opt->json_schema, "Constrain the output to JSON valid under this JSON schema")
      ->check(non_empty);
  cmd->add_option("--json-schema-file", opt->json_schema_file, "Read the JSON schema from this file")->check(non_empty);
  cmd->add_flag("--json", opt->json, "Print one JSON object (ids, text, timings) instead of streaming");
  add_mmap_flag(cmd, opt->mmap);
  add_spec_flag(cmd, opt->spec, "Speculative decoding: off, lookup, lookahead or auto");
  cmd->add_option("--spec-window", opt->spec_window, "Max draft tokens verified per step (0 = none, not even a grammar's forced tokens)")
      ->capture_default_str();
  add_spec_tree_flag(cmd, opt->spec_tree);
  add_kv_tier_flags(cmd, opt->kv);
  cmd->add_option("--trace", opt->trace,
                  "Write a Chrome trace-event JSON (open in Perfetto) of the run to this file");
  cmd->callback([opt, prompt, file, seed, temp, top_k, top_p, min_p, rep] {
    if (prompt->count() == 0 && file->count() == 0) {
      throw CliError("generate needs -p PROMPT (use -p \"\" to start from BOS) or -f FILE");
    }
    opt->seed_given = seed->count() > 0;
    opt->temp_given = temp->count() > 0;
    opt->top_k_given = top_k->count() > 0;
    opt->top_p_given = top_p->count() > 0;
    opt->min_p_given = min_p->count() > 0;
    opt->repeat_penalty_given = rep->count() > 0;
    run_generate(*opt);
  });
}

}  // namespace fdl::cli
