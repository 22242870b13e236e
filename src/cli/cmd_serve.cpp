// `flashdllm serve` — the OpenAI-compatible HTTP server (src/server, docs/SERVER.md).
//
// Loads the model, starts the Engine (continuous batching on its own thread), optionally a
// Redis control subscriber for the breakers, then serves HTTP until SIGINT/SIGTERM.
// Shutdown is graceful: new generation requests get 503, in-flight ones finish (their
// streams are written to the end), then the process exits 0.
// The chosen address is printed on stderr as `flashdllm: listening on http://HOST:PORT`
// (flushed), so a test or supervisor that passed --port 0 can read the port.
#include <CLI/CLI.hpp>
#include <pthread.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_error.h"
#include "cli/commands.h"
#include "cli/kv_tier_flags.h"
#include "cli/model_flags.h"
#include "cli/model_path.h"
#include "cli/option_checks.h"
#include "cli/spec_flags.h"
#include "control/redis_control.h"
#include "engine/resolved_options.h"
#include "flashdllm/engine.h"
#include "model/sampling_defaults.h"
#include "server/api_keys.h"
#include "server/chat_renderer.h"
#include "server/http_server.h"

namespace fdl::cli {
namespace {

struct ServeOptions {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::vector<std::string> api_keys;  // --api-key, repeatable
  std::string api_key_file;           // one key per line
  bool metrics_public = false;
  bool fault_injection = false;
  long long max_queue = 0;
  int ctx_size = 0;
  int max_num_seqs = 8;
  int max_num_batched_tokens = 512;
  int block_size = 16;
  bool no_length_buckets = false;
  int short_prompt_tokens = 128;
  int long_prompt_tokens = 512;
  bool no_prefix_cache = false;
  bool no_async_scheduling = false;
  std::string chat_template;       // a built-in name, a Jinja file or Jinja text; "" = the model's
  std::string chat_template_file;  // a Jinja file
  std::string spec = "off";
  int spec_window = 5;
  std::string spec_tree = "off";  // --spec-tree on|off
  std::string control_redis;
  std::string redis_password_file;
  std::string redis_user;
  int threads = 0;
  bool mmap = false;
  long long max_body_bytes = 1 << 20;
  std::string served_model_name;
  int http_threads = 64;
  KvTierFlags kv;  // --kv-tier0-bytes, --kv-host-bytes, --kv-disk-*, --kv-placement
};

// How long shutdown waits for running streams to write their last chunks after the engine
// has drained (a client that stopped reading must not hold the process forever).
constexpr auto kStreamFlushTimeout = std::chrono::seconds(10);
// How long shutdown then waits for idle or stalled connections to close.
constexpr auto kConnectionCloseTimeout = std::chrono::seconds(5);

void check_options(const ServeOptions& o) {
  check_int_in("--port", o.port, 0, 65535);
  check_ctx_size("--ctx-size", o.ctx_size);
  check_int_in("--max-num-seqs", o.max_num_seqs, 1, 4096);
  check_int_in("--max-num-batched-tokens", o.max_num_batched_tokens, 1, 1 << 20);
  if (o.max_num_batched_tokens < o.max_num_seqs) {
    throw CliError("--max-num-batched-tokens must be >= --max-num-seqs (each running request "
                   "needs one token per step)");
  }
  check_int_in("--block-size", o.block_size, 1, kMaxBlockSize);
  check_int_in("--short-prompt-tokens", o.short_prompt_tokens, 1, 1 << 20);
  check_int_in("--long-prompt-tokens", o.long_prompt_tokens, o.short_prompt_tokens, 1 << 20);
  check_int_in("--spec-window", o.spec_window, 0, 64);
  check_int_in("-t/--threads", o.threads, 0, kMaxThreads);
  check_int_in("--max-body-bytes", o.max_body_bytes, 1024, 1LL << 30);
  check_int_in("--http-threads", o.http_threads, 2, 4096);
  check_int_in("--max-queue", o.max_queue, 0, 1LL << 30);
  if (o.control_redis.empty() && (!o.redis_password_file.empty() || !o.redis_user.empty()))
    throw CliError(std::string(o.redis_user.empty() ? "--redis-password-file" : "--redis-user") +
                   " is for --control-redis, which is not given");
}

// A non-empty environment variable, or "".
std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// The API keys: every --api-key, or the lines of --api-key-file, or else $FLASHDLLM_API_KEY
// (a key in a file or the environment stays out of `ps`, unlike --api-key).
server::ApiKeys api_keys(const ServeOptions& o) {
  std::vector<std::string> keys = o.api_keys;
  std::string origin = "--api-key";
  try {
    if (!o.api_key_file.empty()) {
      origin = "--api-key-file " + o.api_key_file;
      keys = server::parse_key_lines(read_text_file("--api-key-file", o.api_key_file));
    } else if (keys.empty()) {
      origin = "FLASHDLLM_API_KEY";
      if (std::string env = env_or_empty("FLASHDLLM_API_KEY"); !env.empty()) keys.push_back(std::move(env));
    }
    return server::ApiKeys(std::move(keys));
  } catch (const std::invalid_argument& e) {
    throw CliError(origin + ": " + e.what());
  }
}

// Redis AUTH for --control-redis: --redis-password-file (its first line) and --redis-user,
// else $FLASHDLLM_REDIS_PASSWORD and $FLASHDLLM_REDIS_USER; no password = no AUTH.
void redis_auth(const ServeOptions& o, control::RedisControl::Options& ro) {
  if (!o.redis_password_file.empty()) {
    try {
      ro.password = server::parse_key_lines(read_text_file("--redis-password-file", o.redis_password_file)).front();
    } catch (const std::invalid_argument& e) {
      throw CliError("--redis-password-file " + o.redis_password_file + ": " + e.what());
    }
  } else {
    ro.password = env_or_empty("FLASHDLLM_REDIS_PASSWORD");
  }
  ro.user = !o.redis_user.empty() ? o.redis_user : env_or_empty("FLASHDLLM_REDIS_USER");
  if (!ro.user.empty() && ro.password.empty())
    throw CliError("Redis user '" + ro.user +
                   "' has no password: give --redis-password-file or FLASHDLLM_REDIS_PASSWORD");
}

// --chat-template / --chat-template-file: a built-in format's name, Jinja text itself (as vLLM
// takes it: anything with `{%` or `{{`), or a Jinja template file, in that order; nullopt when
// neither is given. Resolved before the model loads, so a bad template fails at once.
std::optional<server::ChatRenderer> explicit_chat_template(const ServeOptions& o) {
  std::string source, origin;
  if (!o.chat_template_file.empty()) {
    source = read_text_file("--chat-template-file", o.chat_template_file);
    origin = o.chat_template_file;
  } else if (o.chat_template.empty()) {
    return std::nullopt;
  } else if (const auto builtin = server::parse_chat_template_name(o.chat_template)) {
    return server::ChatRenderer::from_builtin(*builtin);
  } else if (o.chat_template.find("{%") != std::string::npos || o.chat_template.find("{{") != std::string::npos) {
    source = o.chat_template;  // Jinja text itself (checked first: it is no path)
    origin = "--chat-template text";
  } else if (std::error_code ec; std::filesystem::is_regular_file(o.chat_template, ec)) {
    source = read_text_file("--chat-template", o.chat_template);
    origin = o.chat_template;
  } else {
    throw CliError("--chat-template " + o.chat_template +
                   ": not llama2, llama3 or chatml, not a file, and not a Jinja template");
  }
  try {
    return server::ChatRenderer::from_jinja(source, origin);
  } catch (const jinja::TemplateError& e) {
    throw CliError(origin + ": " + e.what());
  }
}

// The chat template: the explicit one, else the model's own (tokenizer.chat_template), else
// none. A model template the interpreter cannot parse falls back to the built-in format its
// markers name, with a warning.
std::optional<server::ChatRenderer> pick_chat_template(std::optional<server::ChatRenderer> explicit_one,
                                                       const Model& model) {
  if (explicit_one) return explicit_one;
  const std::string jinja = model.gguf().get_string_or("tokenizer.chat_template", "");
  if (jinja.empty()) return std::nullopt;
  try {
    return server::ChatRenderer::from_jinja(jinja, "the model's tokenizer.chat_template");
  } catch (const jinja::TemplateError& e) {
    const auto builtin = server::detect_chat_template(jinja);
    spdlog::warn("the model's chat template does not parse ({}); {}", e.what(),
                 builtin ? std::string("using the built-in ") + server::chat_template_name(*builtin) + " format"
                         : std::string("chat requests will be refused"));
    return builtin ? std::optional(server::ChatRenderer::from_builtin(*builtin)) : std::nullopt;
  }
}

EngineOptions engine_options(const ServeOptions& o) {
  EngineOptions e;
  e.generator.block_size = o.block_size;
  e.generator.n_ctx = o.ctx_size;
  e.generator.max_sequences = o.max_num_seqs;
  try {
    e.generator.spec.mode = parse_spec_mode(o.spec);
  } catch (const std::invalid_argument& ex) {
    throw CliError(std::string("--spec: ") + ex.what());
  }
  e.generator.spec.window = o.spec_window;
  e.generator.spec.tree = o.spec_tree == "on";
  e.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  e.scheduler.length_buckets = !o.no_length_buckets;
  e.scheduler.short_prompt_tokens = o.short_prompt_tokens;
  e.scheduler.long_prompt_tokens = o.long_prompt_tokens;
  e.scheduler.prefix_cache = !o.no_prefix_cache;
  e.scheduler.async_scheduling = !o.no_async_scheduling;
  return e;
}

void run_serve(const ServeOptions& o) {
  check_options(o);
  std::optional<server::ChatRenderer> explicit_chat = explicit_chat_template(o);
  server::ApiKeys keys = api_keys(o);
  // Logs go to stderr: stdout stays free for whatever a supervisor wants to pipe.
  spdlog::set_default_logger(spdlog::stderr_color_mt("flashdllm-serve"));
  if (const std::string warning = server::exposure_warning(o.host, !keys.empty()); !warning.empty())
    spdlog::warn("{}", warning);

  // Block the shutdown signals before any thread exists, so every thread inherits the mask
  // and only the waiter below receives them (no async-signal-safety concerns).
  // An ignored signal is discarded even while blocked, so sigwait() would never see it.
  // SIGTERM is always honoured (a supervisor's stop); an inherited "ignore SIGINT" is kept,
  // as the shell sets it for background jobs so that Ctrl-C does not reach them.
  ::signal(SIGTERM, SIG_DFL);
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);  // a vanished client must never kill the server

  std::optional<control::RedisUrl> redis_url;
  control::RedisControl::Options redis_options;
  if (!o.control_redis.empty()) {
    try {
      redis_url = control::parse_redis_url(o.control_redis);
    } catch (const std::invalid_argument& e) {
      throw CliError(std::string("--control-redis: ") + e.what());
    }
    redis_auth(o, redis_options);
  }

  const auto path = resolve_model_path(o.model);
  LoadedModel loaded = load_model(path, model_options(o.threads, o.mmap, model_context(o.ctx_size)));
  const int n_ctx_train = loaded.model->config().n_ctx_train;
  if (n_ctx_train > 0 && o.ctx_size > n_ctx_train) {
    throw CliError("--ctx-size " + std::to_string(o.ctx_size) +
                   ": exceeds the model's context of " + std::to_string(n_ctx_train) + " tokens");
  }
  EngineOptions eo = engine_options(o);
  eo.generator.kv_tiers = kv_tier_options(o.kv);
  try {  // against the context the engine will use (the default when --ctx-size is 0)
    const int pool_ctx = engine::resolve_options(*loaded.model, eo.generator).n_ctx;
    eo.kv_blocks = kv_tier0_blocks(o.kv, loaded.model->kv_shape(o.block_size).block_bytes(), pool_ctx, o.block_size,
                                   ctx_description(o.ctx_size, pool_ctx));
  } catch (const std::invalid_argument& e) {
    throw CliError(e.what());
  }
  Engine engine(*loaded.model, *loaded.tokenizer, eo);

  std::unique_ptr<control::RedisControl> redis;
  if (redis_url) {
    redis = std::make_unique<control::RedisControl>(*redis_url, [&engine](const control::ControlCommand& c) {
      if (c.action == "trip") {
        engine.trip_breaker(c.breaker, c.reason.empty() ? "via Redis control" : c.reason);
      } else {
        engine.reset_breaker(c.breaker);
      }
      spdlog::info("breaker '{}' {} via Redis control", c.breaker, c.action);
    }, redis_options);
  }

  server::ServerOptions so;
  so.host = o.host;
  so.port = o.port;
  so.api_keys = std::move(keys);
  so.metrics_public = o.metrics_public;
  so.fault_injection = o.fault_injection;
  so.max_queue = o.max_queue;
  so.served_model_name = o.served_model_name.empty() ? path.stem().string() : o.served_model_name;
  so.chat = pick_chat_template(std::move(explicit_chat), *loaded.model);
  so.sampling_defaults = with_model_defaults(SamplingParams{}, model_sampling_defaults(loaded.model->gguf()));
  so.max_body_bytes = size_t(o.max_body_bytes);
  so.http_threads = o.http_threads;
  server::HttpServer server(engine, so);
  const int port = server.bind();

  spdlog::info("model {} (n_ctx {}, max-num-seqs {}, KV blocks {}), chat template: {}",
               path.string(), engine.options().generator.n_ctx, o.max_num_seqs,
               engine.options().kv_blocks,
               so.chat ? so.chat->describe() : "none");
  std::fprintf(stderr, "flashdllm: listening on http://%s:%d\n", o.host.c_str(), port);
  std::fflush(stderr);

  std::mutex run_mu;
  std::condition_variable run_cv;
  bool run_returned = false;
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    spdlog::info("signal {}: draining in-flight requests", sig);
    server.begin_drain();
    engine.drain();
    const auto deadline = std::chrono::steady_clock::now() + kStreamFlushTimeout;
    while (server.active_requests() > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    server.stop();
    // httplib's stop() joins its connection threads; a client still trickling a request body
    // (slowloris) would hold one, and the process, forever. Every request has been answered
    // or drained by now, so past the grace period the process ends without them.
    std::unique_lock lk(run_mu);
    if (!run_cv.wait_for(lk, kConnectionCloseTimeout, [&] { return run_returned; })) {
      spdlog::warn("connections still open {} s after shutdown: exiting without them",
                   kConnectionCloseTimeout.count());
      std::fflush(stderr);
      std::_Exit(0);
    }
  });
  const bool ok = server.run();
  {
    std::lock_guard lk(run_mu);
    run_returned = true;
  }
  run_cv.notify_all();
  if (!ok) pthread_kill(waiter.native_handle(), SIGTERM);  // release the waiter
  waiter.join();
  if (!ok) throw CliError("the HTTP server stopped unexpectedly");
  spdlog::info("stopped");
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (docs/SERVER.md)");
  cmd->add_option("-m,--model", o->model, "GGUF file or Hugging Face model directory (default: $FLASHDLLM_MODEL or stories260K)");
  cmd->add_option("--host", o->host, "Address to bind (loopback by default)")->capture_default_str();
  cmd->add_option("--port", o->port, "TCP port (0 = any free port, printed on stderr)")->capture_default_str();
  auto* api_key = cmd->add_option("--api-key", o->api_keys,
                                  "Require 'Authorization: Bearer KEY' on every route but /health (repeatable: one "
                                  "key per tenant; visible in ps, prefer --api-key-file or FLASHDLLM_API_KEY)")
                       ->expected(1)
                       ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--api-key-file", o->api_key_file, "API keys, one per line (instead of --api-key)")
      ->excludes(api_key);
  cmd->add_flag("--metrics-public", o->metrics_public, "Serve /metrics without the API key (for scrapers)");
  cmd->add_flag("--fault-injection", o->fault_injection,
                "Serve POST /admin/faults, which makes KV-tier transfers fail and flips stored bits (soak tests only)");
  cmd->add_option("--max-queue", o->max_queue,
                  "Waiting requests beyond which new ones get 429 with Retry-After (0 = unbounded)")
      ->capture_default_str();
  cmd->add_option("-c,--ctx-size", o->ctx_size, "Context per request in tokens (0 = min(model context, 4096))")
      ->capture_default_str();
  cmd->add_option("--max-num-seqs", o->max_num_seqs, "Requests running at once")->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", o->max_num_batched_tokens, "Tokens per engine step")
      ->capture_default_str();
  cmd->add_option("--block-size", o->block_size, "KV cache block size in tokens")->capture_default_str();
  cmd->add_flag("--no-length-buckets", o->no_length_buckets, "First-come first-served admission");
  cmd->add_option("--short-prompt-tokens", o->short_prompt_tokens, "Prompts shorter than this are short")
      ->capture_default_str();
  cmd->add_option("--long-prompt-tokens", o->long_prompt_tokens, "Prompts longer than this are long")
      ->capture_default_str();
  cmd->add_flag("--no-prefix-cache", o->no_prefix_cache, "Do not share KV blocks of common prompt prefixes");
  cmd->add_flag("--no-async-scheduling", o->no_async_scheduling,
                "Wait for each decode step's tokens before queuing the next (GPU: async by default)");
  auto* chat_template = cmd->add_option(
      "--chat-template", o->chat_template,
      "Chat template: a Jinja template file, Jinja text, or the built-in llama2, llama3 or chatml (default: the "
      "model's own tokenizer.chat_template)");
  cmd->add_option("--chat-template-file", o->chat_template_file, "Chat template: a Jinja template file")
      ->excludes(chat_template);
  add_spec_flag(cmd, o->spec, "Speculative decoding: off, lookup, lookahead or auto");
  cmd->add_option("--spec-window", o->spec_window, "Max draft tokens verified per step")->capture_default_str();
  add_spec_tree_flag(cmd, o->spec_tree);
  cmd->add_option("--control-redis", o->control_redis,
                  "Breaker commands from Redis Pub/Sub, e.g. redis://127.0.0.1:6379/flashdllm-control");
  cmd->add_option("--redis-password-file", o->redis_password_file,
                  "Redis AUTH password: the file's first line (default: $FLASHDLLM_REDIS_PASSWORD)");
  cmd->add_option("--redis-user", o->redis_user, "Redis AUTH user, for ACLs (default: $FLASHDLLM_REDIS_USER)");
  cmd->add_option("-t,--threads", o->threads, "Compute threads (0 = all cores)")->capture_default_str();
  add_mmap_flag(cmd, o->mmap);
  add_kv_tier_flags(cmd, o->kv);
  cmd->add_option("--max-body-bytes", o->max_body_bytes, "Largest request body (larger: 413)")
      ->capture_default_str();
  cmd->add_option("--served-model-name", o->served_model_name, "Model name reported (default: file stem)");
  cmd->add_option("--http-threads", o->http_threads, "HTTP connection threads (bounds concurrent streams)")
      ->capture_default_str();
  cmd->callback([o] { run_serve(*o); });
}

}  // namespace fdl::cli
