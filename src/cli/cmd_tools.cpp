// `flashdllm tools make-model` — write a random-weight llama/qwen2/qwen3 GGUF of a preset shape
// (fdl::tools::make_model), e.g. for benchmarks: no download needed, llama.cpp loads it too.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "cli/cli_error.h"
#include "cli/commands.h"
#include "cli/option_checks.h"
#include "flashdllm/gguf.h"
#include "flashdllm/tokenizer.h"
#include "tools/make_model.h"

namespace fdl::cli {
namespace {

/// Command-line values before validation; shape fields are wide and signed so that "-3"
/// or "5000000000" are caught with a clear message instead of wrapping around.
struct MakeModelArgs {
  std::string output;
  std::string preset = "tiny";
  std::string dtype = "f16";
  std::string seed = "42";  // parsed and range-checked in to_options
  std::string vocab_from;
  std::string name;
  std::string arch;
  long long dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, ffn_dim = 0, vocab = 0,
            context = 0, n_expert = 0, n_expert_used = 0;
  float rope_theta = 0, rms_eps = 0;
  float weight_std = 0.02f;
  bool tied_embeddings = false;
  int threads = 0;
  // which optional flags were given
  CLI::Option *dim_opt = nullptr, *n_layers_opt = nullptr, *n_heads_opt = nullptr,
              *n_kv_heads_opt = nullptr, *ffn_dim_opt = nullptr, *vocab_opt = nullptr,
              *context_opt = nullptr, *rope_theta_opt = nullptr, *rms_eps_opt = nullptr,
              *vocab_from_opt = nullptr, *arch_opt = nullptr, *n_expert_opt = nullptr,
              *n_expert_used_opt = nullptr;
};

std::optional<uint32_t> shape_value(const CLI::Option* given, long long value, const char* flag) {
  if (given->count() == 0) return std::nullopt;
  if (value < 1 || value > std::numeric_limits<uint32_t>::max()) {
    throw CliError(std::string(flag) + " must be a positive 32-bit integer, got " +
                   std::to_string(value));
  }
  return static_cast<uint32_t>(value);
}

tools::MakeModelOptions to_options(const MakeModelArgs& a) {
  tools::MakeModelOptions o;
  o.output = a.output;
  o.preset = a.preset;
  const tools::WeightSpec spec = tools::parse_weight_spec(a.dtype);
  o.dtype = spec.type;
  o.medium_mix = spec.medium_mix;
  o.seed = *parse_seed("--seed", a.seed, /*allow_random=*/false);
  if (a.vocab_from_opt->count() > 0) o.vocab_from = a.vocab_from;
  if (a.arch_opt->count() > 0) o.arch = a.arch;
  o.dim = shape_value(a.dim_opt, a.dim, "--dim");
  o.n_layers = shape_value(a.n_layers_opt, a.n_layers, "--n-layers");
  o.n_heads = shape_value(a.n_heads_opt, a.n_heads, "--n-heads");
  o.n_kv_heads = shape_value(a.n_kv_heads_opt, a.n_kv_heads, "--n-kv-heads");
  o.ffn_dim = shape_value(a.ffn_dim_opt, a.ffn_dim, "--ffn-dim");
  o.vocab = shape_value(a.vocab_opt, a.vocab, "--vocab");
  o.context = shape_value(a.context_opt, a.context, "--context");
  o.n_expert = shape_value(a.n_expert_opt, a.n_expert, "--n-experts");
  o.n_expert_used = shape_value(a.n_expert_used_opt, a.n_expert_used, "--n-experts-used");
  if (a.rope_theta_opt->count() > 0) {
    check_finite_in("--rope-theta", a.rope_theta, 1.0, 1e12);
    o.rope_theta = a.rope_theta;
  }
  if (a.rms_eps_opt->count() > 0) {
    check_finite_in("--rms-eps", a.rms_eps, 1e-12, 1.0);
    o.rms_eps = a.rms_eps;
  }
  check_finite_in("--weight-std", a.weight_std, 0.0, 10.0);
  o.weight_std = a.weight_std;
  o.tied_embeddings = a.tied_embeddings;
  o.name = a.name;
  check_int_in("-t/--threads", a.threads, 0, kMaxThreads);
  o.threads = static_cast<unsigned>(a.threads);
  return o;
}

/// The tokenizer copied by --vocab-from must be one flashdllm can load, or the model written
/// would be rejected by every other command: check it before writing anything.
void check_vocab_source(const std::filesystem::path& vocab) {
  const std::string where = "--vocab-from " + vocab.string() + ": ";
  const auto strip = [&](std::string msg) {
    const std::string prefix = vocab.string() + ": ";
    if (msg.compare(0, prefix.size(), prefix) == 0) msg.erase(0, prefix.size());
    return msg;
  };
  try {
    const GgufFile gguf = GgufFile::open(vocab);
    (void)Tokenizer::from_gguf(gguf);
  } catch (const TokenizerError& e) {
    throw CliError(where + "flashdllm cannot use this tokenizer: " + strip(e.what()));
  } catch (const GgufError& e) {
    throw CliError(where + strip(e.what()));
  }
}

void run_make_model(const MakeModelArgs& args) {
  const tools::MakeModelOptions opt = to_options(args);
  if (opt.vocab_from) check_vocab_source(*opt.vocab_from);
  const tools::ModelShape shape = tools::resolve_model_shape(opt);  // validates before writing
  const auto t0 = std::chrono::steady_clock::now();
  tools::make_model(opt);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string experts = shape.n_expert > 0 ? " x " + std::to_string(shape.n_expert) + " experts (" +
                                                       std::to_string(shape.n_expert_used) + " per token)"
                                                 : "";
  std::printf(
      "wrote %s: preset %s, %s %s, dim %u, layers %u, heads %u (kv %u), ffn %u%s, vocab %u, "
      "context %u, %.1f MiB in %.2f s\n",
      opt.output.string().c_str(), opt.preset.c_str(), shape.arch.c_str(), args.dtype.c_str(), shape.dim,
      shape.n_layers, shape.n_heads, shape.n_kv_heads, shape.ffn_dim,
      experts.c_str(), shape.vocab, shape.context,
      static_cast<double>(std::filesystem::file_size(opt.output)) / (1024.0 * 1024.0), s);
}

void add_make_model_command(CLI::App& tools_app) {
  auto a = std::make_shared<MakeModelArgs>();
  std::string presets;
  for (const auto& p : tools::model_presets()) presets += (presets.empty() ? "" : "|") + p;
  CLI::App* cmd = tools_app.add_subcommand("make-model", "Write a random-weight llama, qwen2, qwen3, gemma2 or Mixtral-style GGUF model");
  cmd->add_option("-o,--output", a->output, "GGUF file to write")->required();
  cmd->add_option("--preset", a->preset, "Shape preset: " + presets)->capture_default_str();
  a->arch_opt = cmd->add_option("--arch", a->arch, "Model family: llama|qwen2|qwen3|gemma2 (default: the preset's)");
  cmd->add_option("--dtype", a->dtype,
                  "Matrix weight type: " + tools::writable_dtype_names() +
                      ", or llama.cpp's mixes q4_k_m, q5_k_m (block-quantized types: rows must hold whole blocks, 256 "
                      "for the K-quants)")
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "Seed of the random weights (0..2^64-1)")->capture_default_str();
  a->vocab_from_opt = cmd->add_option("--vocab-from", a->vocab_from,
                                      "Copy the tokenizer from this GGUF (e.g. a llama.cpp vocab file)");
  a->dim_opt = cmd->add_option("--dim", a->dim, "Embedding size (override)");
  a->n_layers_opt = cmd->add_option("--n-layers", a->n_layers, "Layers (override)");
  a->n_heads_opt = cmd->add_option("--n-heads", a->n_heads, "Attention heads (override)");
  a->n_kv_heads_opt = cmd->add_option("--n-kv-heads", a->n_kv_heads, "KV heads (override)");
  a->ffn_dim_opt = cmd->add_option("--ffn-dim", a->ffn_dim, "FFN hidden size (override)");
  a->vocab_opt = cmd->add_option("--vocab", a->vocab, "Vocab size of the synthesized tokenizer");
  a->context_opt = cmd->add_option("--context", a->context, "Context length metadata (override)");
  a->n_expert_opt =
      cmd->add_option("--n-experts", a->n_expert, "Experts per layer: a Mixtral-style mixture, arch llama (override; <= 512)");
  a->n_expert_used_opt =
      cmd->add_option("--n-experts-used", a->n_expert_used,
                      "Experts per token (default: 2, at most --n-experts, when --n-experts is given; else the preset's)");
  a->rope_theta_opt = cmd->add_option("--rope-theta", a->rope_theta, "RoPE base frequency (override)");
  a->rms_eps_opt = cmd->add_option("--rms-eps", a->rms_eps, "RMSNorm epsilon (override)");
  cmd->add_option("--weight-std", a->weight_std, "Std of the random matrix values")->capture_default_str();
  cmd->add_flag("--tied-embeddings", a->tied_embeddings, "Omit output.weight (reuse token_embd)");
  cmd->add_option("--name", a->name, "general.name (default flashdllm-random-<preset>)");
  cmd->add_option("-t,--threads", a->threads, "Fill threads (0 = all cores)")->capture_default_str();
  cmd->callback([a] { run_make_model(*a); });
}

}  // namespace

void add_tools_command(CLI::App& app) {
  CLI::App* tools_app = app.add_subcommand("tools", "Developer utilities");
  tools_app->require_subcommand(1);
  add_make_model_command(*tools_app);
  add_check_invariance_command(*tools_app);
  add_json_schema_to_grammar_command(*tools_app);
}

}  // namespace fdl::cli
