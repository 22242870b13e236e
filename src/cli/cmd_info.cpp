// `flashdllm info` — what a GGUF model file holds: architecture, dimensions, parameter
// count, tensor dtypes and the tokenizer. Reads metadata only; no weights are touched, so
// it is instant even for multi-GB files.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/model_path.h"
#include "flashdllm/gguf.h"
#include "flashdllm/model.h"
#include "flashdllm/tokenizer.h"

namespace fdl::cli {
namespace {

struct InfoOptions {
  std::string model;
  bool json = false;
};

nlohmann::json describe(const GgufFile& gguf) {
  const ModelConfig cfg = ModelConfig::from_gguf(gguf);
  const auto tokenizer = Tokenizer::from_gguf(gguf);

  uint64_t n_params = 0;
  std::map<std::string, int> tensor_types;  // sorted, so output is stable
  for (const GgufTensorInfo& t : gguf.tensors()) {
    n_params += t.n_elements();
    ++tensor_types[ggml_type_name(t.type_id)];
  }

  nlohmann::json j;
  j["file"] = gguf.path();
  j["file_size"] = gguf.file_size();
  j["gguf_version"] = gguf.version();
  j["architecture"] = cfg.arch;
  j["name"] = cfg.name;
  j["n_vocab"] = cfg.n_vocab;
  j["n_embd"] = cfg.n_embd;
  j["n_layer"] = cfg.n_layer;
  j["n_head"] = cfg.n_head;
  j["n_head_kv"] = cfg.n_head_kv;
  j["head_dim"] = cfg.head_dim;
  j["n_ff"] = cfg.n_ff;
  j["n_ctx_train"] = cfg.n_ctx_train;
  j["rope_freq_base"] = cfg.rope_freq_base;
  j["rms_eps"] = cfg.rms_eps;
  j["tied_output"] = cfg.tied_output;
  j["n_params"] = n_params;
  j["n_tensors"] = gguf.tensors().size();
  j["tensor_types"] = tensor_types;
  j["tokenizer"] = {{"model", std::string(tokenizer->model_name())},
                    {"n_vocab", tokenizer->n_vocab()},
                    {"bos_id", tokenizer->bos_id()},
                    {"eos_id", tokenizer->eos_id()},
                    {"add_bos", tokenizer->add_bos()}};
  return j;
}

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

void print_plain(const nlohmann::json& j) {
  const auto& tok = j["tokenizer"];
  std::printf("file:          %s (%s)\n", j["file"].get<std::string>().c_str(),
              human_bytes(j["file_size"].get<uint64_t>()).c_str());
  std::printf("gguf version:  %u\n", j["gguf_version"].get<unsigned>());
  std::printf("architecture:  %s%s%s\n", j["architecture"].get<std::string>().c_str(),
              j["name"].get<std::string>().empty() ? "" : ", name: ",
              j["name"].get<std::string>().c_str());
  std::printf("embedding:     %d\n", j["n_embd"].get<int>());
  std::printf("layers:        %d\n", j["n_layer"].get<int>());
  std::printf("heads:         %d (kv heads %d, head dim %d)\n", j["n_head"].get<int>(),
              j["n_head_kv"].get<int>(), j["head_dim"].get<int>());
  std::printf("ffn:           %d\n", j["n_ff"].get<int>());
  std::printf("context:       %d (trained)\n", j["n_ctx_train"].get<int>());
  std::printf("rope base:     %g, rms eps: %g, tied output: %s\n",
              j["rope_freq_base"].get<double>(), j["rms_eps"].get<double>(),
              j["tied_output"].get<bool>() ? "yes" : "no");
  std::printf("parameters:    %llu (%.2f M)\n",
              static_cast<unsigned long long>(j["n_params"].get<uint64_t>()),
              static_cast<double>(j["n_params"].get<uint64_t>()) / 1e6);
  std::printf("tensors:       %zu:", j["n_tensors"].get<size_t>());
  for (const auto& [type, count] : j["tensor_types"].items()) {
    std::printf(" %s x%d", type.c_str(), count.get<int>());
  }
  std::printf("\n");
  std::printf("tokenizer:     %s, vocab %d, bos %d, eos %d, add bos: %s\n",
              tok["model"].get<std::string>().c_str(), tok["n_vocab"].get<int>(),
              tok["bos_id"].get<int>(), tok["eos_id"].get<int>(),
              tok["add_bos"].get<bool>() ? "yes" : "no");
}

void run_info(const InfoOptions& opt) {
  const GgufFile gguf = GgufFile::open(resolve_model_path(opt.model));
  const nlohmann::json j = describe(gguf);
  if (opt.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    print_plain(j);
  }
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto opt = std::make_shared<InfoOptions>();
  CLI::App* cmd = app.add_subcommand("info", "Show a model's architecture, size and tokenizer");
  cmd->add_option("-m,--model", opt->model, "GGUF model file (default: $FLASHDLLM_MODEL or stories260K)");
  cmd->add_flag("--json", opt->json, "Print one JSON object");
  cmd->callback([opt] { run_info(*opt); });
}

}  // namespace fdl::cli
