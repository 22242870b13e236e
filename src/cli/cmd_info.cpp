// `flashdllm info` — what a GGUF model file holds: architecture, dimensions, parameter
// count, tensor dtypes and the tokenizer. Reads metadata only; no weights are touched, so
// it is instant even for multi-GB files.
//
// Any valid GGUF is described, whatever its architecture or tokenizer: the generic
// `<arch>.*` fields are read straight from the metadata, and whether flashdllm can generate
// with the file is one more line ("supported: no (...)") rather than a failure.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/json_output.h"
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

/// A library message without the "<path>: " prefix (info already names the file).
std::string reason_of(const std::exception& e, const std::string& path) {
  std::string s = e.what();
  const std::string prefix = path + ": ";
  if (s.compare(0, prefix.size(), prefix) == 0) s.erase(0, prefix.size());
  return s;
}

/// An unsigned integer metadata value, or null when absent or not a scalar integer.
nlohmann::json meta_uint(const GgufFile& f, const std::string& key) {
  try {
    if (f.find(key) == nullptr) return nullptr;
    return f.get_uint(key);
  } catch (const GgufError&) {
    return nullptr;
  }
}

nlohmann::json meta_float(const GgufFile& f, const std::string& key) {
  try {
    if (f.find(key) == nullptr) return nullptr;
    return f.get_float(key);
  } catch (const GgufError&) {
    return nullptr;
  }
}

nlohmann::json meta_int(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  if (v == nullptr) return nullptr;
  try {
    return f.get_int_or(key, 0);
  } catch (const GgufError&) {
    return nullptr;
  }
}

/// Number of entries of an array key, or null.
nlohmann::json array_count(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  if (v == nullptr || v->type != GgufType::ARRAY) return nullptr;
  return v->count;
}

nlohmann::json describe(const GgufFile& gguf) {
  const std::string path = gguf.path();
  std::vector<std::string> unsupported;  // every reason flashdllm cannot generate with it

  uint64_t n_params = 0;
  std::map<std::string, int> tensor_types;  // sorted, so output is stable
  const GgufTensorInfo* first_unsupported = nullptr;  // of a type no backend computes with
  int n_unsupported = 0;
  for (const GgufTensorInfo& t : gguf.tensors()) {
    n_params += t.n_elements();
    ++tensor_types[ggml_type_name(t.type_id)];
    if (!is_supported_weight_type(t.type()) && n_unsupported++ == 0) first_unsupported = &t;
  }
  if (first_unsupported != nullptr)  // the loader's words for the same refusal
    unsupported.push_back("tensor '" + first_unsupported->name + "' has unsupported type " +
                          ggml_type_name(first_unsupported->type_id) +
                          (n_unsupported > 1 ? " (and " + std::to_string(n_unsupported - 1) + " more tensors)" : "") +
                          "; supported weight types: " + std::string(supported_weight_types()));

  nlohmann::json j;
  j["file"] = path;
  j["file_size"] = gguf.file_size();
  j["gguf_version"] = gguf.version();
  std::string arch;
  try {
    arch = gguf.get_string_or("general.architecture", "");
  } catch (const GgufError&) {
  }
  std::string name;
  try {
    name = gguf.get_string_or("general.name", "");
  } catch (const GgufError&) {
  }
  j["architecture"] = arch;
  j["name"] = name;

  std::optional<ModelConfig> cfg;
  try {
    cfg = ModelConfig::from_gguf(gguf);
  } catch (const std::exception& e) {
    unsupported.push_back(reason_of(e, path));
  }
  if (cfg) {
    j["n_vocab"] = cfg->n_vocab;
    j["n_embd"] = cfg->n_embd;
    j["n_layer"] = cfg->n_layer;
    j["n_head"] = cfg->n_head;
    j["n_head_kv"] = cfg->n_head_kv;
    j["head_dim"] = cfg->head_dim;
    j["n_ff"] = cfg->n_ff;
    j["n_expert"] = cfg->n_expert;
    j["n_expert_used"] = cfg->n_expert_used;
    j["n_ctx_train"] = cfg->n_ctx_train;
    j["rope_freq_base"] = cfg->rope_freq_base;
    j["rms_eps"] = cfg->rms_eps;
    j["tied_output"] = gguf.tensors().empty() ? nlohmann::json(nullptr)
                                              : nlohmann::json(cfg->tied_output);
  } else {
    // Generic `<arch>.*` keys, null where absent or not a single number.
    const std::string p = arch + ".";
    j["n_vocab"] = meta_uint(gguf, p + "vocab_size");
    if (j["n_vocab"].is_null()) j["n_vocab"] = array_count(gguf, "tokenizer.ggml.tokens");
    j["n_embd"] = meta_uint(gguf, p + "embedding_length");
    j["n_layer"] = meta_uint(gguf, p + "block_count");
    j["n_head"] = meta_uint(gguf, p + "attention.head_count");
    j["n_head_kv"] = meta_uint(gguf, p + "attention.head_count_kv");
    j["head_dim"] = j["n_embd"].is_number() && j["n_head"].is_number() && j["n_head"] != 0
                        ? nlohmann::json(j["n_embd"].get<uint64_t>() / j["n_head"].get<uint64_t>())
                        : nlohmann::json(nullptr);
    j["n_ff"] = meta_uint(gguf, p + "feed_forward_length");
    j["n_expert"] = meta_uint(gguf, p + "expert_count");
    j["n_expert_used"] = meta_uint(gguf, p + "expert_used_count");
    j["n_ctx_train"] = meta_uint(gguf, p + "context_length");
    j["rope_freq_base"] = meta_float(gguf, p + "rope.freq_base");
    j["rms_eps"] = meta_float(gguf, p + "attention.layer_norm_rms_epsilon");
    j["tied_output"] = gguf.tensors().empty()
                           ? nlohmann::json(nullptr)
                           : nlohmann::json(gguf.find_tensor("output.weight") == nullptr);
  }
  j["n_params"] = n_params;
  j["n_tensors"] = gguf.tensors().size();
  j["tensor_types"] = tensor_types;

  // Tokenizer: from metadata first, then the loaded tokenizer's view where flashdllm has one.
  if (gguf.find("tokenizer.ggml.model") == nullptr && gguf.find("tokenizer.ggml.tokens") == nullptr) {
    j["tokenizer"] = nullptr;
    unsupported.push_back("no tokenizer in the file");
  } else {
    std::string tok_model;
    try {
      tok_model = gguf.get_string_or("tokenizer.ggml.model", "");
    } catch (const GgufError&) {
    }
    nlohmann::json tok = {{"model", tok_model},
                          {"n_vocab", array_count(gguf, "tokenizer.ggml.tokens")},
                          {"bos_id", meta_int(gguf, "tokenizer.ggml.bos_token_id")},
                          {"eos_id", meta_int(gguf, "tokenizer.ggml.eos_token_id")},
                          {"add_bos", nullptr}};
    try {
      tok["add_bos"] = gguf.get_bool_or("tokenizer.ggml.add_bos_token", false);
    } catch (const GgufError&) {
    }
    try {
      const auto tokenizer = Tokenizer::from_gguf(gguf);
      tok["model"] = std::string(tokenizer->model_name());
      tok["n_vocab"] = tokenizer->n_vocab();
      tok["bos_id"] = tokenizer->bos_id();
      tok["eos_id"] = tokenizer->eos_id();
      tok["add_bos"] = tokenizer->add_bos();
    } catch (const std::exception& e) {
      unsupported.push_back(reason_of(e, path));
    }
    j["tokenizer"] = tok;
  }
  if (gguf.tensors().empty()) unsupported.push_back("no tensors: a vocab-only file");
  j["supported"] = unsupported.empty();
  if (!unsupported.empty()) {
    std::string reason;
    for (const auto& r : unsupported) reason += (reason.empty() ? "" : "; ") + r;
    j["unsupported_reason"] = reason;
  }
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

/// A JSON number as text, "-" for null.
std::string num(const nlohmann::json& v) {
  if (v.is_null()) return "-";
  if (v.is_number_float()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v.get<double>());
    return buf;
  }
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  return v.dump();
}

void print_plain(const nlohmann::json& j) {
  std::printf("file:          %s (%s)\n", j["file"].get<std::string>().c_str(),
              human_bytes(j["file_size"].get<uint64_t>()).c_str());
  std::printf("gguf version:  %u\n", j["gguf_version"].get<unsigned>());
  const std::string arch = j["architecture"].get<std::string>();
  std::printf("architecture:  %s%s%s\n", arch.empty() ? "-" : arch.c_str(),
              j["name"].get<std::string>().empty() ? "" : ", name: ",
              j["name"].get<std::string>().c_str());
  std::printf("embedding:     %s\n", num(j["n_embd"]).c_str());
  std::printf("layers:        %s\n", num(j["n_layer"]).c_str());
  std::printf("heads:         %s (kv heads %s, head dim %s)\n", num(j["n_head"]).c_str(),
              num(j["n_head_kv"]).c_str(), num(j["head_dim"]).c_str());
  if (j["n_expert"].is_number() && j["n_expert"].get<int64_t>() > 0)
    std::printf("ffn:           %s x %s experts (%s per token)\n", num(j["n_ff"]).c_str(), num(j["n_expert"]).c_str(),
                num(j["n_expert_used"]).c_str());
  else
    std::printf("ffn:           %s\n", num(j["n_ff"]).c_str());
  std::printf("context:       %s (trained)\n", num(j["n_ctx_train"]).c_str());
  std::printf("rope base:     %s, rms eps: %s, tied output: %s\n",
              num(j["rope_freq_base"]).c_str(), num(j["rms_eps"]).c_str(),
              num(j["tied_output"]).c_str());
  std::printf("parameters:    %llu (%.2f M)\n",
              static_cast<unsigned long long>(j["n_params"].get<uint64_t>()),
              static_cast<double>(j["n_params"].get<uint64_t>()) / 1e6);
  std::printf("tensors:       %zu%s", j["n_tensors"].get<size_t>(),
              j["tensor_types"].empty() ? "" : ":");
  for (const auto& [type, count] : j["tensor_types"].items()) {
    std::printf(" %s x%d", type.c_str(), count.get<int>());
  }
  std::printf("\n");
  const auto& tok = j["tokenizer"];
  if (tok.is_null()) {
    std::printf("tokenizer:     none\n");
  } else {
    const std::string model = tok["model"].get<std::string>();
    std::printf("tokenizer:     %s, vocab %s, bos %s, eos %s, add bos: %s\n",
                model.empty() ? "-" : model.c_str(), num(tok["n_vocab"]).c_str(),
                num(tok["bos_id"]).c_str(), num(tok["eos_id"]).c_str(),
                num(tok["add_bos"]).c_str());
  }
  if (j["supported"].get<bool>()) {
    std::printf("supported:     yes\n");
  } else {
    std::printf("supported:     no (%s)\n", j["unsupported_reason"].get<std::string>().c_str());
  }
}

void run_info(const InfoOptions& opt) {
  const GgufFile gguf = Model::open_file(resolve_model_path(opt.model));
  const nlohmann::json j = describe(gguf);
  if (opt.json) {
    print_json_line(j);
  } else {
    print_plain(j);
  }
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto opt = std::make_shared<InfoOptions>();
  CLI::App* cmd = app.add_subcommand("info", "Show a model's architecture, size and tokenizer");
  cmd->add_option("-m,--model", opt->model, "GGUF file or Hugging Face model directory (default: $FLASHDLLM_MODEL or stories260K)");
  cmd->add_flag("--json", opt->json, "Print one JSON object");
  cmd->callback([opt] { run_info(*opt); });
}

}  // namespace fdl::cli
